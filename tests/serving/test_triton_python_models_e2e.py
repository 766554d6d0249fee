"""A Triton user's Python-backend model on the embedded Triton, real processes on real sockets: control
plane, `serving triton` (tritonserver, Python backend) and `serving worker` (HTTP and gRPC), driven by
the `serving` CLI and stock clients (httpx, tritonclient.http, tritonclient.grpc).

The model (tests/serving/triton/triton_models.py) is uploaded as its model folder, config.pbtxt and
``1/model.py``: it runs as it is, its own code, config parameters and string tensors. Every answer is
compared with what its model.py computes when run directly on the same texts. A format the embedded
Triton has no backend for (a TensorRT plan) is refused at `model add` with a 422 that names the way.
A ``model.py`` uploaded alone, without its config.pbtxt, is served when its tensors are known (its own
``auto_complete_config``, or ClearML's ``--input-*``/``--output-*`` flags) and refused at `model add` with
a 422 saying what is missing otherwise.
"""
from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.serving.stack import make_stack
from tests.serving.triton.triton_models import run_model_py, shout_alone, shout_folder, tensorrt_plan
from tests.support.procs import free_port

TEXTS = ["café", "naïve 東京", "ok", ""]
SUFFIX = {1: "", 2: " (v2)"}  # config.pbtxt's parameter of each version: tells the answering version apart


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-python")
    folders = {v: shout_folder(root / f"v{v}", SUFFIX[v], version=str(v)) for v in SUFFIX}
    s = make_stack(root / "home", workers=1)
    s.env["SERVING_WORKER_GRPC_PORT"] = str(free_port())
    try:
        s.start_components(statistics=False, triton=True)
        for v in SUFFIX:
            s.cli("model", "upload", "--name", "shout", "--path", str(folders[v]))
        s.cli("model", "add", "--endpoint", "shout", "--model", "shout:1", "--engine", "triton", "--wait")
        s.folders, s.root = folders, root
        yield s
    finally:
        s.stop_all()


def expected(stack, version: int, texts: list[str]) -> dict[str, list]:
    direct = run_model_py(stack.folders[version], texts, SUFFIX[version])
    return {"UPPER": [b.decode() for b in direct["UPPER"]], "LENGTH": direct["LENGTH"].tolist()}


@pytest.mark.timeout(300)
def test_the_model_answers_as_its_model_py_over_serve_v2_http_and_grpc(stack):
    want = expected(stack, 1, TEXTS)
    assert want["UPPER"][:2] == ["CAFÉ", "NAÏVE 東京"] and want["LENGTH"][:2] == [4, 8]

    r = httpx.post(f"{stack.worker_url()}/serve/shout", json={"inputs": {"TEXT": TEXTS}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == want

    http = httpclient.InferenceServerClient(stack.worker_url().removeprefix("http://"))
    meta = http.get_model_metadata("shout")
    http.close()
    assert meta["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1]}]
    assert meta["platform"] == "python"  # as Triton says of a Python-backend model
    assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [("UPPER", "BYTES"), ("LENGTH", "INT32")]
    grpc_url = f"127.0.0.1:{stack.env['SERVING_WORKER_GRPC_PORT']}"
    for protocol, url in ((httpclient, stack.worker_url().removeprefix("http://")), (grpcclient, grpc_url)):
        client = protocol.InferenceServerClient(url)
        text = protocol.InferInput("TEXT", [len(TEXTS)], "BYTES")
        text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
        result = client.infer("shout", [text])
        client.close()
        assert [b.decode() for b in result.as_numpy("UPPER")] == want["UPPER"], protocol.__name__
        assert result.as_numpy("LENGTH").tolist() == want["LENGTH"], protocol.__name__


@pytest.mark.timeout(300)
def test_a_canary_between_two_versions_splits_as_asked(stack):
    """30% to version 2: of N answers, each is exactly one version's model.py output, and version 2's
    count lies within 5 standard deviations of 0.3 N (binomial; a false alarm below 1e-6)."""
    stack.cli("model", "add", "--endpoint", "shout", "--model", "shout:2", "--canary", "30%", "--wait")
    answers = {v: expected(stack, v, ["route me"]) for v in SUFFIX}
    n, counts = 200, {1: 0, 2: 0}
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            r = client.post(f"{stack.worker_url()}/serve/shout", json={"inputs": {"TEXT": ["route me"]}})
            assert r.status_code == 200, r.text
            version = next(v for v, want in answers.items() if r.json()["outputs"] == want)
            counts[version] += 1
    sd = (n * 0.3 * 0.7) ** 0.5
    assert abs(counts[2] - 0.3 * n) <= 5 * sd, counts


@pytest.mark.timeout(120)
def test_a_tensorrt_plan_is_refused_on_the_embedded_triton_naming_the_way(stack):
    plan = tensorrt_plan(stack.root / "model.plan")
    out = stack.cli("model", "upload", "--name", "engine", "--path", str(plan)).stdout
    assert "registered engine:1" in out, out
    assert stack.api().get("/models", params={"name": "engine"}).json()[0]["framework"] == "tensorrt"
    r = stack.api().post("/endpoints", json={"endpoint": "trt", "model": "engine", "engine": "triton"})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert all(words in detail for words in ("a TensorRT plan", "'tensorrt'", "only the python backend",
                                             "SERVING_TRITON_MODEL_REPOSITORY")), detail
    res = stack.cli("model", "add", "--endpoint", "trt", "--model", "engine", check=False)
    assert res.returncode != 0 and "a TensorRT plan" in res.stdout + res.stderr
    assert stack.api().get("/endpoints/trt").status_code == 404


def answers_as_its_model_py(stack, endpoint: str, model_py) -> None:
    want = run_model_py(model_py.parent.parent, TEXTS, "")
    r = httpx.post(f"{stack.worker_url()}/serve/{endpoint}", json={"inputs": {"TEXT": TEXTS}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"] == {"UPPER": [b.decode() for b in want["UPPER"]], "LENGTH": want["LENGTH"].tolist()}
    client = httpclient.InferenceServerClient(stack.worker_url().removeprefix("http://"))
    text = httpclient.InferInput("TEXT", [len(TEXTS)], "BYTES")
    text.set_data_from_numpy(np.array([t.encode() for t in TEXTS], dtype=np.object_))
    result = client.infer(endpoint, [text])
    client.close()
    assert [b.decode() for b in result.as_numpy("UPPER")] == [b.decode() for b in want["UPPER"]]


@pytest.mark.timeout(300)
def test_a_model_py_alone_that_declares_its_tensors_in_auto_complete_config_is_served(stack):
    model_py = shout_alone(stack.root / "auto", auto_complete=True)
    stack.cli("model", "upload", "--name", "shout-auto", "--path", str(model_py))
    stack.cli("model", "add", "--endpoint", "shout-auto", "--model", "shout-auto:1", "--engine", "triton", "--wait")
    answers_as_its_model_py(stack, "shout-auto", model_py)


@pytest.mark.timeout(300)
def test_a_model_py_alone_is_served_with_its_tensors_named_by_clearmls_flags(stack):
    model_py = shout_alone(stack.root / "flags", auto_complete=False)
    stack.cli("model", "upload", "--name", "shout-flags", "--path", str(model_py))
    stack.cli("model", "add", "--endpoint", "shout-flags", "--model", "shout-flags:1", "--engine", "triton",
              "--input-name", "TEXT", "--input-type", "bytes", "--input-size", "[-1]",
              "--output-name", "UPPER", "LENGTH", "--output-type", "bytes", "int32", "--output-size", "[-1]", "[-1]",
              "--wait")
    answers_as_its_model_py(stack, "shout-flags", model_py)


def test_a_model_py_alone_with_nothing_declaring_its_tensors_is_refused_at_model_add(stack):
    model_py = shout_alone(stack.root / "bare", auto_complete=False)
    stack.cli("model", "upload", "--name", "shout-bare", "--path", str(model_py))
    res = stack.cli("model", "add", "--endpoint", "shout-bare", "--model", "shout-bare:1", "--engine", "triton",
                    check=False)
    said = res.stdout + res.stderr
    assert res.returncode != 0 and "422" in said, said
    for words in ("shout-bare:1 is a Python-backend model.py uploaded without its config.pbtxt",
                  "Triton would load it with none and refuse every request", "--path MODEL_DIR",
                  "auto_complete_config", "--input-name/--input-type/--input-size"):
        assert words in " ".join(said.split()), (words, said)
    with stack.api() as api:
        assert api.get("/endpoints/shout-bare").status_code == 404, "nothing was deployed"
        r = api.post("/endpoints", json={"endpoint": "shout-bare", "model": "shout-bare", "engine": "triton"})
        assert r.status_code == 422 and "without its config.pbtxt" in r.json()["detail"], r.text

"""Plain PyTorch files through the platform: `serving model upload` (exported to ONNX where onnxruntime
agrees with torch, else kept for engine torch), `serving model add`, then the worker's /serve, v2 HTTP
and v2 gRPC, answers compared with the user's own torch model. The control plane is a real one on a
socket, the CLI runs in-process, the worker is built in-process from the control plane's snapshot (no
socket adds anything there); gRPC is the worker's own server on a free port."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as aioclient
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from registry.api import create_app as control_plane_app
from serving.cli.main import app as cli_app
from serving.settings import ControlPlaneSettings
from serving.worker.app import create_app as worker_app
from tests.serving.pytorch import models
from tests.serving.worker.support import worker_settings
from tests.support.auth import headers, token
from tests.support.procs import free_port
from tests.support.servers import serve_in_thread

TORCH_ATOL = 1e-5  # engine torch runs the user's own model
ONNX_ATOL = ONNX_RTOL = 1e-4  # the upload's agreement tolerance (serving/pytorch/export.py)

# endpoint/model name -> (maker, extra upload flags, runtime the upload must choose)
CASES: dict[str, tuple[Any, list[str], str]] = {
    "ts": (models.torchscript, [], "onnx"),
    "pt2": (models.exported_program, [], "onnx"),
    "sd": (models.two_inputs, [], "onnx"),
    "ts-fft": (models.spectrum, [], "torch"),  # the exporter has no operator for torch.fft
    "sd-gate": (models.batch_gate, [], "torch"),  # the traced branch disagrees at another batch size
    "pt2-torch": (models.exported_program, ["--runtime", "torch"], "torch"),
    "sd-torch": (models.two_inputs, ["--runtime", "torch"], "torch"),
}


@dataclass
class Platform:
    url: str
    home: Path
    root: Path
    made: dict[str, models.Made] = field(default_factory=dict)
    outputs: dict[str, str] = field(default_factory=dict)

    def cli(self, *args: str) -> Any:
        return CliRunner().invoke(cli_app, ["--control-plane", self.url, *args],
                                  env={"SERVING_TOKEN": token(self.home)}, terminal_width=400)

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=headers(self.home))


def _words(output: str) -> str:
    """The CLI's wrapped lines and error box, as one line of words."""
    return " ".join(output.replace("│", " ").split())


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    root = tmp_path_factory.mktemp("pytorch")
    home = root / "cp"
    with serve_in_thread(control_plane_app(ControlPlaneSettings(home=home))) as url:
        p = Platform(url, home, root)
        for name, (make, extra, runtime) in CASES.items():
            made = p.made[name] = make(root / name)
            res = p.cli("model", "upload", "--name", name, "--path", str(made.path), *made.args, *extra)
            assert res.exit_code == 0, res.output
            p.outputs[name] = _words(res.output)
            engine = ["--engine", "onnxruntime"] if runtime == "onnx" else []  # torch: implied by the format
            res = p.cli("model", "add", "--endpoint", name, "--model", name, *engine)
            assert res.exit_code == 0, res.output
        yield p


@pytest.fixture(scope="module")
def worker(platform):
    with platform.api() as api:
        snapshot = api.get("/config").json()
    with TestClient(worker_app(worker_settings(platform.home), snapshot=snapshot)) as client:
        yield client


def feeds(name: str, batch: int = 3) -> dict[str, np.ndarray]:
    """A batch size none of the upload's samples had (1, 2, 5)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((batch, 4)).astype(np.float32)
    if name.startswith("sd") and "gate" not in name:
        return {"x": x, "ids": rng.integers(0, 4, (batch, 6)).astype(np.int64)}
    return {"x": x}


def assert_close(got: dict[str, Any], want: dict[str, np.ndarray], runtime: str) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        if runtime == "torch":
            np.testing.assert_allclose(np.asarray(got[key], dtype=value.dtype), value, rtol=0, atol=TORCH_ATOL)
        else:
            np.testing.assert_allclose(np.asarray(got[key], dtype=value.dtype), value, rtol=ONNX_RTOL, atol=ONNX_ATOL)


def test_each_upload_prints_the_runtime_it_chose_and_why(platform):
    out = platform.outputs
    for name in ("ts", "pt2", "sd"):
        assert "runtime: onnx (exported to ONNX; onnxruntime agrees with torch on batch sizes 1, 2, 5" in out[name]
    assert "runtime: torch (the ONNX export failed: torch.onnx.export failed" in out["ts-fft"]
    assert "aten::fft_rfft" in out["ts-fft"]
    assert "runtime: torch (the ONNX export disagrees with torch: output 'output__0'" in out["sd-gate"]
    assert "at batch size 5" in out["sd-gate"] and "tracing warned" in out["sd-gate"]
    assert "runtime: torch (--runtime torch)" in out["pt2-torch"]
    assert "registered ts:1" in out["ts"] and "served as onnx" in out["ts"]
    assert "served as pytorch-state-dict (engine torch)" in out["sd-gate"]


def test_the_choice_and_the_agreement_are_kept_on_the_version(platform):
    with platform.api() as api:
        versions = {m["name"]: m for m in api.get("/models").json()}
    frameworks = {n: versions[n]["framework"] for n in CASES}
    assert frameworks == {"ts": "onnx", "pt2": "onnx", "sd": "onnx", "ts-fft": "torchscript", "sd-gate":
                          "pytorch-state-dict", "pt2-torch": "torch-export", "sd-torch": "pytorch-state-dict"}
    for name, (_, _, runtime) in CASES.items():
        meta = versions[name]["metadata"]["pytorch"]
        assert meta["runtime"] == runtime and meta["reason"], meta
    exported = versions["sd"]["metadata"]["pytorch"]
    assert exported["source"] == "pytorch-state-dict" and exported["model_class"] == "Scorer"
    agreement = exported["agreement"]
    assert agreement["agrees"] and agreement["max_abs_diff"] < 1e-5 and agreement["batch_sizes"] == [2, 1, 5]
    assert (agreement["atol"], agreement["rtol"]) == (1e-4, 1e-4)
    assert versions["sd-gate"]["metadata"]["pytorch"]["agreement"]["agrees"] is False
    assert versions["pt2-torch"]["metadata"]["pytorch"]["forced"] is True
    # the signature a torch version is served with: Triton's names, a dynamic batch (and length) dimension
    assert versions["sd-torch"]["signature"] == {
        "inputs": [{"name": "x", "dtype": "FP32", "shape": [-1, 4]},
                   {"name": "ids", "dtype": "INT64", "shape": [-1, -1]}],
        "outputs": [{"name": "probs", "dtype": "FP32", "shape": [-1, 3]},
                    {"name": "pooled", "dtype": "FP32", "shape": [-1, 3]}]}
    # the ONNX file has the same tensors, read from the graph by the control plane
    onnx_inputs = versions["sd"]["signature"]["inputs"]
    assert [(t["name"], t["shape"]) for t in onnx_inputs] == [("x", [-1, 4]), ("ids", [-1, -1])]


def test_a_deploy_without_engine_gets_torch_for_a_torch_version(platform):
    with platform.api() as api:
        endpoints = api.get("/config").json()["endpoints"]
    assert {n: endpoints[n]["engine"] for n in CASES} == {
        n: "onnxruntime" if runtime == "onnx" else "torch" for n, (_, _, runtime) in CASES.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_serve_json_answers_as_the_users_torch_model(platform, worker, name):
    tensors = feeds(name)
    r = worker.post(f"/serve/{name}", json={"inputs": {k: v.tolist() for k, v in tensors.items()}})
    assert r.status_code == 200, r.text
    assert_close(r.json()["outputs"], platform.made[name].reference(**tensors), CASES[name][2])


@pytest.mark.parametrize("name", ["sd", "sd-torch", "sd-gate", "pt2-torch", "ts-fft"])
def test_v2_http_answers_as_the_users_torch_model(platform, worker, name):
    tensors = feeds(name, batch=4)
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": "FP32" if v.dtype == np.float32 else "INT64",
                        "data": v.ravel().tolist()} for k, v in tensors.items()]}
    r = worker.post(f"/v2/models/{name}/infer", json=body)
    assert r.status_code == 200, r.text
    got = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    assert_close(got, platform.made[name].reference(**tensors), CASES[name][2])
    meta = worker.get(f"/v2/models/{name}").json()
    assert [i["name"] for i in meta["inputs"]] == list(tensors)


def test_v2_grpc_answers_as_the_users_torch_model(platform, worker):
    names = ["sd-torch", "sd-gate", "pt2-torch", "sd"]

    async def call() -> dict[str, dict[str, np.ndarray]]:
        from serving.worker.frontends.grpc_service import start_grpc_server

        port = free_port()
        server = await start_grpc_server(worker.app.state.dataplane, "127.0.0.1", port, 1 << 20)
        try:
            async with aioclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
                answers = {}
                for name in names:
                    inputs = []
                    for key, value in feeds(name, batch=5).items():
                        tensor = aioclient.InferInput(key, list(value.shape), "FP32" if value.dtype == np.float32
                                                      else "INT64")
                        tensor.set_data_from_numpy(value)
                        inputs.append(tensor)
                    result = await client.infer(name, inputs)
                    answers[name] = {o.name: result.as_numpy(o.name) for o in result.get_response().outputs}
                return answers
        finally:
            await server.stop(0)

    answers = asyncio.run(call())
    for name in names:
        assert_close(answers[name], platform.made[name].reference(**feeds(name, batch=5)), CASES[name][2])


@pytest.mark.parametrize("name,body,words", [
    ("sd-torch", {"inputs": {"x": [[1.0, 2.0, 3.0]], "ids": [[1, 2]]}}, ["'x'", "[1, 3]", "[-1, 4]"]),
    ("sd-torch", {"inputs": {"x": [[1.0, 2.0, 3.0, 4.0]]}}, ["ids"]),
    ("sd-torch", {"inputs": {"x": [[1.0, 2.0, 3.0, 4.0]], "ids": [[9, 1]]}}, ["torch rejected the input",
                                                                            "index out of range"]),
    ("sd-torch", {"inputs": {"x": [["a", "b", "c", "d"]], "ids": [[1]]}}, ["'x'", "not numbers"]),
    ("pt2-torch", {"inputs": {"x": [1.0, 2.0, 3.0, 4.0]}}, ["'x'", "[4]", "[-1, 4]"]),
    ("ts-fft", {"x": [[1.0, 2.0]]}, ["'x'", "[1, 2]"]),
    ("sd-gate", "not an object", ["JSON object"]),
])
def test_bad_input_is_a_4xx_naming_the_problem(worker, name, body, words):
    r = worker.post(f"/serve/{name}", json=body)
    assert 400 <= r.status_code < 500, r.text
    assert all(w in r.text for w in words), r.text


def test_bad_v2_input_on_engine_torch_is_a_400(worker):
    body = {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1.0, 2.0, 3.0]}]}
    r = worker.post("/v2/models/pt2-torch/infer", json=body)
    assert r.status_code == 400 and "'x'" in r.text, r.text


def test_runtime_onnx_on_an_export_that_fails_is_a_clear_error(platform):
    made = platform.made["ts-fft"]
    res = platform.cli("model", "upload", "--name", "fft-onnx", "--path", str(made.path), *made.args,
                       "--runtime", "onnx")
    assert res.exit_code == 2, res.output
    words = _words(res.output)
    assert "--runtime onnx: the ONNX export failed" in words and "fft_rfft" in words, words
    with platform.api() as api:
        assert not [m for m in api.get("/models").json() if m["name"] == "fft-onnx"]


def test_runtime_onnx_on_an_export_that_disagrees_is_a_clear_error(platform):
    made = platform.made["sd-gate"]
    res = platform.cli("model", "upload", "--name", "gate-onnx", "--path", str(made.path), *made.args,
                       "--runtime", "onnx")
    assert res.exit_code == 2 and "--runtime onnx: the ONNX export disagrees with torch" in _words(res.output)


def test_runtime_onnx_where_it_agrees_is_marked_forced(platform):
    made = platform.made["pt2"]
    res = platform.cli("model", "upload", "--name", "pt2-onnx", "--path", str(made.path), "--runtime", "onnx")
    assert res.exit_code == 0 and "runtime: onnx" in _words(res.output), res.output
    with platform.api() as api:
        (m,) = [m for m in api.get("/models").json() if m["name"] == "pt2-onnx"]
    assert m["framework"] == "onnx" and m["metadata"]["pytorch"]["forced"] is True


def test_torchscript_without_input_sizes_registers_as_before_and_serves_with_declared_tensors(platform, tmp_path):
    """No --input-size: nothing to export with; registered as TorchScript (engine triton on an external
    Triton reads the endpoint's flags, as before); engine torch needs the tensors declared."""
    made = platform.made["ts"]
    res = platform.cli("model", "upload", "--name", "ts-bare", "--path", str(made.path))
    assert res.exit_code == 0 and "runtime: torch (no sample inputs" in _words(res.output), res.output
    res = platform.cli("model", "add", "--endpoint", "ts-bare", "--model", "ts-bare")
    assert res.exit_code != 0 and "uploaded without its inputs" in _words(res.output), res.output
    res = platform.cli("model", "add", "--endpoint", "ts-bare", "--model", "ts-bare", "--input-name", "x",
                       "--input-type", "float32", "--input-size", "[-1, 4]")
    assert res.exit_code == 0 and "(torch)" in res.output, res.output
    with platform.api() as api:
        snapshot = api.get("/config").json()
    tensors = feeds("ts")
    with TestClient(worker_app(worker_settings(platform.home), snapshot=snapshot)) as client:
        r = client.post("/serve/ts-bare", json={"inputs": {"x": tensors["x"].tolist()}})
    assert r.status_code == 200, r.text
    assert_close(r.json()["outputs"], made.reference(**tensors), "torch")


def test_a_checkpoint_without_its_model_file_is_refused_naming_model_file(platform):
    res = platform.cli("model", "upload", "--name", "w", "--path", str(platform.made["sd"].path))
    assert res.exit_code == 2, res.output
    words = "".join(_words(res.output).split())
    assert "aPyTorchcheckpoint(torch.save)" in words and "--model-filemodel.py" in words, res.output

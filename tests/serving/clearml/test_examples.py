"""ClearML Serving compatibility over real sockets: the fixtures in ``examples/`` (``preprocess.py``
files written here against ClearML's ``Preprocess`` interface) deployed with ClearML's command
lines (commands.py) to a real stack (control plane, statistics service, worker, embedded Triton).
Every answer is compared with running the same fixture and model directly.

Tests share one stack and run in file order (the pipeline uses the sklearn endpoints; the
lightgbm and keras flows auto-update one endpoint name, ``test_model_auto``; the statistics test
uses the sklearn and custom endpoints).
"""
from __future__ import annotations

import base64
import gzip
import re
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serving.clearml import digits, models
from tests.serving.clearml.commands import (COMMANDS, TRAINED, add_update_canary, auto_update_and_canary, endpoint_of,
                                            routes, run_typed, serve, upload_trained, wait_ready)
from tests.serving.clearml.models import EXAMPLES, example_module
from tests.serving.stack import Stack, make_stack
from tests.support.procs import wait_until

JSON = {"accept": "application/json", "Content-Type": "application/json"}


def direct(fixture: str, body: Any, run: Callable[[Any], Any] | None = None, model_file: Path | None = None,
           **endpoint: Any) -> Any:
    """The reference: the fixture's hooks called in the worker's order with one ``state`` dict, the
    model run directly by ``run`` (None: the fixture's own ``process``)."""
    user = example_module(fixture).Preprocess()
    user.model_endpoint = SimpleNamespace(**endpoint)
    if model_file is not None:
        user.load(str(model_file))
    state: dict = {}
    data = user.preprocess(body, state, None)
    data = user.process(data, state, None) if run is None else run(data)
    return user.postprocess(data, state, None)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model):
    out = tmp_path_factory.mktemp("clearml-models")
    hf_home = tmp_path_factory.mktemp("hf-home")
    models.seed_hf_cache(hf_home, tiny_model.tokenizer_dir)
    return {"out": out, "hf_home": hf_home, "sklearn": models.sklearn_logistic(out),
            "ensemble": models.sklearn_ensemble(out), "xgboost": models.xgboost_regressor(out),
            "lightgbm": models.lightgbm_multiclass(out), "custom": models.sklearn_logistic(out, n_features=3),
            "pytorch": models.digit_cnn(out), "keras": models.digit_dense(out),
            "huggingface": models.renamed_output(tiny_model.onnx_path, out)}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, built) -> Path:
    """Where the commands run: ``examples/`` beside the trained model files."""
    work = tmp_path_factory.mktemp("clearml-checkout")
    (work / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    for fixture, (_, file) in TRAINED.items():
        shutil.copy(built["sklearn" if fixture == "pipeline" else fixture], work / file)
    shutil.copy(built["huggingface"], work / "model.bin")
    return work


@pytest.fixture(scope="module")
def stack(tmp_path_factory, built):
    s = make_stack(tmp_path_factory.mktemp("clearml-stack"), workers=1)
    s.env.update({"HF_HOME": str(built["hf_home"]), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                  "SERVING_STATISTICS_HOST": "127.0.0.1"})
    try:
        s.start_components(statistics=True, triton=True)
        yield s
    finally:
        s.stop_all()


# --- in-process engines -----------------------------------------------------------------------
def test_sklearn_json_and_gzip(stack, workdir, built):
    import joblib

    predict = joblib.load(built["sklearn"]).predict
    upload_trained(stack, workdir, "sklearn")
    run_typed(stack, workdir, COMMANDS["sklearn"][0])
    wait_ready(stack, "test_model_sklearn")
    r = serve(stack, "test_model_sklearn", headers=JSON, json={"x0": 1, "x1": 2})
    assert r.status_code == 200, r.text
    assert r.json() == direct("sklearn/preprocess.py", {"x0": 1, "x1": 2}, predict)
    r = serve(stack, "test_model_sklearn", content=gzip.compress(b'{"x0": -9, "x1": 3}'),
              headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json() == direct("sklearn/preprocess.py", {"x0": -9, "x1": 3}, predict)
    assert {tuple(direct("sklearn/preprocess.py", {"x0": x, "x1": 2}, predict)["y"]) for x in (-12, 8)} == {(0,), (1,)}


def test_sklearn_auto_update_and_canary(stack, workdir, built):
    """auto-update then canary: the newest two versions share traffic 10/90, and keep doing so as a
    new version is uploaded."""
    import joblib

    expected = direct("sklearn/preprocess.py", {"x0": 1, "x1": 2}, joblib.load(built["sklearn"]).predict)

    def check(ep: str) -> httpx.Response:
        r = serve(stack, ep, headers=JSON, json={"x0": 1, "x1": 2})
        assert r.status_code == 200 and r.json() == expected, r.text
        return r

    auto_update_and_canary(stack, workdir, "sklearn", check)
    ep = "test_model_sklearn_auto"
    upload_trained(stack, workdir, "sklearn")  # version 3: now versions 2 and 3 serve, 10/90
    assert routes(stack, ep) == pytest.approx({2: 10.0, 3: 90.0})
    wait_ready(stack, ep, {2, 3})
    served = [check(ep).headers["X-Model-Version"] for _ in range(300)]
    share = served.count("2") / len(served)
    assert set(served) == {"2", "3"}
    # 300 draws of p=0.1: 0.1 +- 4.5 standard deviations (0.017) fails by chance about once in 10^5 runs
    assert abs(share - 0.1) < 0.078, share
    # the other form: named versions of the endpoint, weights in that order
    stack.cli("model", "canary", "--endpoint", ep, "--weights", "0.3", "0.7", "--input-endpoints", f"{ep}/3", f"{ep}/2")
    assert routes(stack, ep) == pytest.approx({3: 30.0, 2: 70.0})
    other = stack.cli("model", "canary", "--endpoint", ep, "--weights", "1", "--input-endpoints", "elsewhere/1",
                      check=False)
    assert other.returncode != 0 and "other endpoints" in other.stdout + other.stderr


def test_canary_prefix_flag_misspelled_is_refused_naming_the_right_one(stack, workdir):
    """``--input-endpoints-prefix`` (plural) appears in ClearML's own documentation, but its argparse
    refuses it too; here the refusal names the flag meant."""
    line = COMMANDS["sklearn"][2].replace("--input-endpoint-prefix", "--input-endpoints-prefix")
    before = stack.api().get("/endpoints/test_model_sklearn_auto").json()
    refused = run_typed(stack, workdir, line, check=False)
    assert refused.returncode != 0 and "--input-endpoint-prefix" in refused.stdout + refused.stderr
    assert stack.api().get("/endpoints/test_model_sklearn_auto").json() == before  # nothing changed


def test_ensemble_model_from_load(stack, workdir, built):
    """``load`` returns the estimator; one point and a batch of points."""
    import joblib

    predict = joblib.load(built["ensemble"]).predict
    bodies = ({"x0": 1, "x1": 2}, {"points": [[1, 2], [-8, 4], [0.5, 7]]})

    def check(ep: str) -> httpx.Response:
        for body in bodies:
            r = serve(stack, ep, headers=JSON, json=body)
            assert r.status_code == 200, r.text
            want = direct("ensemble/preprocess.py", body, predict)["y"]
            assert len(r.json()["y"]) == len(want)
            np.testing.assert_allclose(r.json()["y"], want, rtol=1e-12)
        return r

    add_update_canary(stack, workdir, "ensemble", check, v2=False)


def test_v2_ready_when_load_returned_the_model(stack, workdir):
    if stack.api().get("/endpoints/test_model_ensemble").status_code == 404:  # run on its own
        upload_trained(stack, workdir, "ensemble")
        run_typed(stack, workdir, COMMANDS["ensemble"][0])
    wait_ready(stack, "test_model_ensemble", v2=False)
    r = httpx.get(f"{stack.worker_url()}/v2/models/test_model_ensemble/ready", timeout=5)
    assert r.status_code == 200, r.text


def test_xgboost_dmatrix_and_state(stack, workdir, built):
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(str(built["xgboost"]))
    body = {"x0": 6.1, "x1": 2.8, "x2": 4.7, "x3": 1.2}
    expected = direct("xgboost/preprocess.py", body, booster.predict)

    def check(ep: str) -> httpx.Response:
        r = serve(stack, ep, headers=JSON, json=body)
        assert r.status_code == 200, r.text
        assert r.json()["rows"] == expected["rows"] == 1  # set in preprocess, read in postprocess
        np.testing.assert_allclose(r.json()["y"], expected["y"], rtol=1e-6)
        return r

    add_update_canary(stack, workdir, "xgboost", check)


def test_lightgbm(stack, workdir, built):
    import lightgbm as lgb

    booster = lgb.Booster(model_file=str(built["lightgbm"]))
    bodies = ({"x0": 5.0, "x1": 3.4, "x2": 1.5, "x3": 0.2}, {"x0": 6.5, "x1": 3, "x2": 5.5, "x3": 2})
    expected = [direct("lightgbm/preprocess.py", body, booster.predict) for body in bodies]
    assert [e["y"] for e in expected] == [0, 2]  # the test tells classes apart

    def check(ep: str) -> httpx.Response:
        for body, want in zip(bodies, expected):
            r = serve(stack, ep, headers=JSON, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["y"] == want["y"] and r.json()["p"] == pytest.approx(want["p"], rel=1e-9)
        return r

    add_update_canary(stack, workdir, "lightgbm", check)


def test_custom_load_process_and_errors(stack, workdir, built):
    """``load`` keeps the model, ``process`` runs it; a body the fixture refuses is a 422 naming what
    its ``preprocess`` said, as running it directly raises."""
    bodies = ({"features": [1, 2, 3]}, {"features": [-9, 4, 7]})
    expected = [direct("custom/preprocess.py", b, model_file=built["custom"]) for b in bodies]

    def check(ep: str) -> httpx.Response:
        for body, want in zip(bodies, expected):
            r = serve(stack, ep, headers=JSON, json=body)
            assert r.status_code == 200, r.text
            assert r.json()["label"] == want["label"]
            assert r.json()["confidence"] == pytest.approx(want["confidence"], rel=1e-12)
        r = serve(stack, ep, headers=JSON, json={"features": [1, 2]})
        assert r.status_code == 422 and "'features': a list of 3 numbers" in r.json()["error"], r.text
        return serve(stack, ep, headers=JSON, json=bodies[0])

    add_update_canary(stack, workdir, "custom", check)
    with pytest.raises(ValueError, match="a list of 3 numbers"):
        direct("custom/preprocess.py", {"features": [1, 2]}, model_file=built["custom"])


def test_template_endpoint_without_a_model(stack):
    """Every hook passing through, deployed with no model: JSON back as JSON, bytes back as bytes."""
    stack.cli("model", "add", "--engine", "custom", "--endpoint", "test_template",
              "--preprocess", str(EXAMPLES / "preprocess_template/preprocess_template.py"))
    wait_ready(stack, "test_template")
    body = {"x0": 1, "x1": [2, 3]}
    r = serve(stack, "test_template", headers=JSON, json=body)
    assert r.status_code == 200 and r.json() == direct("preprocess_template/preprocess_template.py", body) == body
    png = digits.encoded(3, "PNG")
    r = serve(stack, "test_template", headers={"Content-Type": "image/png"}, content=png)
    assert r.status_code == 200 and r.content == png, r.text


def test_pipeline_threads_then_asyncio(stack, workdir, built):
    """Two sklearn endpoints and a pipeline endpoint calling both with send_request and averaging:
    the threaded version, then the asyncio version on the same endpoint."""
    import joblib

    upload_trained(stack, workdir, "pipeline")
    add_a, add_b, threaded, asyncio_version = COMMANDS["pipeline"]
    run_typed(stack, workdir, add_a)
    run_typed(stack, workdir, add_b)
    predict = joblib.load(built["sklearn"]).predict
    for line, engine in ((threaded, "custom"), (asyncio_version, "custom_async")):
        run_typed(stack, workdir, line)
        assert stack.api().get("/endpoints/test_model_pipeline").json()["engine"] == engine
        for ep in ("test_model_sklearn_a", "test_model_sklearn_b", "test_model_pipeline"):
            wait_ready(stack, ep)
        assert httpx.get(f"{stack.worker_url()}/status").json()["endpoints"]["test_model_pipeline"]["engine"] == engine
        for x0 in (-12, 8):  # one point of each class
            r = serve(stack, "test_model_pipeline", headers=JSON, json={"x0": x0, "x1": 2})
            assert r.status_code == 200, r.text
            assert r.json() == {"y": float(predict([[x0, 2]])[0])}
    r = serve(stack, "test_model_pipeline", headers=JSON, json={"x0": 1})
    assert r.status_code == 422 and "missing x1" in r.json()["error"], r.text


# --- Triton engine, ONNX; pictures as raw bytes or JSON ---------------------------------------------
def _onnx(path: Path, feed: str, shape: tuple[int, ...]) -> Callable[[np.ndarray], np.ndarray]:
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda array: sess.run(None, {feed: array.reshape(shape).astype(np.float32)})[0]


def test_pytorch_picture_bytes(stack, workdir, built):
    run = _onnx(built["pytorch"], "INPUT__0", (1, 28, 28))
    pictures = {"image/jpeg": digits.encoded(5), "image/png": digits.encoded(2, "PNG")}
    expected = {kind: direct("pytorch/preprocess.py", body, run, input_size=[[1, 28, 28]])
                for kind, body in pictures.items()}
    assert (expected["image/jpeg"]["digit"], expected["image/png"]["digit"]) == (5, 2)  # the network reads them

    def check(ep: str) -> httpx.Response:
        for kind, body in pictures.items():
            r = serve(stack, ep, headers={"Content-Type": kind}, content=body)
            assert r.status_code == 200, r.text
            got, want = r.json(), expected[kind]
            assert (got["digit"], got["size"]) == (want["digit"], [28, 28])
            np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-6)
        return r

    add_update_canary(stack, workdir, "pytorch", check)
    r = serve(stack, "test_model_pytorch", headers={"Content-Type": "image/jpeg"}, content=b"not a picture")
    assert r.status_code == 422 and "not a picture Pillow can read" in r.json()["error"], r.text
    r = serve(stack, "test_model_pytorch", headers=JSON, json={"x": 1})
    assert r.status_code == 422 and "image Content-Type" in r.json()["error"], r.text


def test_keras_picture_as_bytes_or_base64_json(stack, workdir, built):
    """The 28x28 array the fixture returns goes to the flat 784-wide input the endpoint declared."""
    run = _onnx(built["keras"], "dense_input", (1, 784))
    jpeg = digits.encoded(7)
    expected = direct("keras/preprocess.py", jpeg, run)
    assert expected == {"digit": 7}
    as_json = {"image": base64.b64encode(jpeg).decode()}
    assert direct("keras/preprocess.py", as_json, run) == expected

    def check(ep: str) -> httpx.Response:
        r = serve(stack, ep, headers=JSON, json=as_json)
        assert r.status_code == 200 and r.json() == expected, r.text
        r = serve(stack, ep, headers={"Content-Type": "image/jpeg"}, content=jpeg)
        assert r.status_code == 200 and r.json() == expected, r.text
        return r

    add_update_canary(stack, workdir, "keras", check)
    r = serve(stack, "test_model_keras", headers=JSON, json={"image": "%%%"})
    assert r.status_code == 422 and "base64" in r.json()["error"], r.text


def test_huggingface_as_typed(stack, workdir, built, tiny_model):
    """`model upload` prints the model id `--model-id <your_model_ID>` takes; both `model add` lines
    run as typed, --aux-config with its escaped quotes and its list given as a string. The fixture
    returns [input_ids, token_type_ids, attention_mask]; the model takes input_ids, attention_mask,
    token_type_ids: bound by the declared names, the logits are right."""
    from transformers import AutoTokenizer

    upload, without_batching, with_batching = COMMANDS["huggingface"]
    printed = run_typed(stack, workdir, upload).stdout
    model_id = re.search(r"model id (\d+)", printed).group(1)
    text = "Deploying a transformer classifier from its ONNX file, tokenizer from the hub cache."
    tok = AutoTokenizer.from_pretrained(str(tiny_model.tokenizer_dir))(text=text, max_length=16, truncation=True,
                                                                       return_tensors="np")
    sess = ort.InferenceSession(str(built["huggingface"]), providers=["CPUExecutionProvider"])
    logits = sess.run(["output"], {i.name: tok[i.name].astype(np.int64) for i in sess.get_inputs()})[0]
    swapped = sess.run(["output"], {"input_ids": tok["input_ids"], "attention_mask": tok["token_type_ids"],
                                    "token_type_ids": tok["attention_mask"]})[0]
    assert not np.allclose(swapped, logits, atol=1e-4), "the test model must tell a swap apart"

    out = run_typed(stack, workdir, without_batching, **{"<your_model_ID>": model_id}).stdout
    assert out.count("ignored: platform, default_model_filename") == 1, out
    wait_ready(stack, "transformer_model")
    r = serve(stack, "transformer_model", headers=JSON, json={"text": text})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"], logits.tolist(), atol=1e-4)

    out = run_typed(stack, workdir, with_batching, **{"<your_model_ID>": model_id}).stdout
    assert out.count("ignored: platform, default_model_filename") == 1, out
    assert "applied: dynamic_batching.preferred_batch_size, dynamic_batching.max_queue_delay_microseconds, " \
           "max_batch_size" in " ".join(out.split()), out
    batching = stack.api().get("/endpoints/transformer_model").json()["batching"]
    assert (batching["max_batch_size"], batching["max_queue_delay_us"], batching["preferred_batch_sizes"]) == \
        (64, 5000000, [1, 2, 4, 8, 16, 32, 64])
    wait_ready(stack, "transformer_model")
    r = serve(stack, "transformer_model", headers=JSON, json={"text": text})
    assert r.status_code == 200, r.text
    np.testing.assert_allclose(r.json()["data"], logits.tolist(), atol=1e-4)


def test_huggingface_wrong_input_name_is_refused(stack, workdir):
    line = COMMANDS["huggingface"][2].replace('"attention_mask"', '"attention_masks"')
    wrong = run_typed(stack, workdir, line, check=False, **{"<your_model_ID>": '"Transformer ONNX"'})  # a name works too
    assert wrong.returncode != 0 and "attention_masks" in wrong.stdout + wrong.stderr
    assert "422" in wrong.stdout + wrong.stderr


# --- custom statistics ---------------------------------------------------------------------------------
def _samples(stack: Stack, family: str, endpoint: str) -> dict[tuple, float]:
    text = httpx.get(f"{stack.statistics_url()}/metrics", timeout=5).text
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k not in ("endpoint", "version")))): s.value
            for f in text_string_to_metric_families(text) if f.name == family
            for s in f.samples if s.labels.get("endpoint") == endpoint}


def test_statistics_of_every_kind_from_collect_custom_statistics_fn(stack, workdir, built):
    """`metrics add` as ClearML types it (``E/1``, ``E/*``, lists of variables, buckets); the values
    the fixtures hand collect_custom_statistics_fn come back from the statistics service as a
    histogram (scalar), counts per value (enum) and the last value (value)."""
    add_scalar, add_custom, remove = COMMANDS["metrics"]
    run_typed(stack, workdir, add_scalar)
    run_typed(stack, workdir, add_custom)
    listed = stack.cli("metrics", "list", "--json").stdout
    for name in ('"x0"', '"x1"', '"label"', '"confidence"', '"width"'):
        assert name in listed, listed
    revision = stack.api().get("/health").json()["revision"]
    wait_until(lambda: httpx.get(f"{stack.statistics_url()}/health").json()["revision"] >= revision,
               timeout=30, what="the statistics service has the variables")
    wait_ready(stack, "test_model_custom")

    xs = [-3, 0.05, 0.3, 0.7, 5, 20]
    for x in xs:
        assert serve(stack, "test_model_sklearn", headers=JSON, json={"x0": x, "x1": 0.5}).status_code == 200
    bodies = [{"features": [1, 2, 3]}, {"features": [-9, 4, 7]}, {"features": [0, 0, 5]}]
    answers = [serve(stack, "test_model_custom", headers=JSON, json=b).json() for b in bodies]
    scalar = wait_until(lambda: (s := _samples(stack, "serving_variable_scalar", "test_model_sklearn"))
                        and s.get(("serving_variable_scalar_count", (("variable", "x0"),))) == len(xs) and s,
                        timeout=30, what="x0 counted")
    cumulative = [scalar[("serving_variable_scalar_bucket", (("le", le), ("variable", "x0")))]
                  for le in ("0.0", "0.1", "0.5", "1.0", "10.0", "+Inf")]
    assert cumulative == [1, 2, 3, 4, 5, 6]  # one value in each bucket, le: value <= bound
    assert scalar[("serving_variable_scalar_sum", (("variable", "x0"),))] == pytest.approx(sum(xs))
    assert scalar[("serving_variable_scalar_count", (("variable", "x1"),))] == len(xs)

    enum = wait_until(lambda: (s := _samples(stack, "serving_variable_enum", "test_model_custom"))
                      and sum(v for (n, _), v in s.items() if n.endswith("_total")) == len(bodies) and s,
                      timeout=30, what="labels counted")
    labels = [a["label"] for a in answers]
    for value in ("left", "right"):
        assert enum[("serving_variable_enum_total", (("value", value), ("variable", "label")))] == labels.count(value)
    gauge = _samples(stack, "serving_variable_value", "test_model_custom")
    assert gauge[("serving_variable_value", (("variable", "confidence"),))] == pytest.approx(answers[-1]["confidence"])
    widths = _samples(stack, "serving_variable_scalar", "test_model_custom")
    assert widths[("serving_variable_scalar_sum", (("variable", "width"),))] == pytest.approx(2 + 16 + 5)

    run_typed(stack, workdir, remove)
    metrics = stack.api().get("/endpoints/test_model_sklearn").json()["metrics"]
    assert metrics == []


def test_scalar_buckets_as_min_max_count(stack, workdir):
    """ClearML's ``NAME=MIN/MAX/COUNT`` form (its ``metrics add --help``): COUNT equal buckets from MIN
    to MAX, the same histogram as the listed bounds; a malformed one is refused naming the form."""
    if stack.api().get("/endpoints/test_model_sklearn").status_code == 404:  # run on its own
        upload_trained(stack, workdir, "sklearn")
        run_typed(stack, workdir, COMMANDS["sklearn"][0])
    add = COMMANDS["metrics"][0].split(" --variable-scalar")[0]
    run_typed(stack, workdir, f'{add} --variable-scalar "x1=0.0/1.0/5" "x2=-1/1/4"')
    declared = {m["name"]: m for m in stack.api().get("/endpoints/test_model_sklearn").json()["metrics"]}
    assert declared["x1"]["buckets"] == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert declared["x2"]["buckets"] == [-1.0, -0.5, 0.0, 0.5, 1.0]
    for bad in ("x3=1/0/5", "x3=0/1/2.5", "x3=0/1"):
        refused = run_typed(stack, workdir, f'{add} --variable-scalar "{bad}"', check=False)
        assert refused.returncode != 0 and "MIN/MAX/COUNT" in refused.stdout + refused.stderr, bad
    assert "x3" not in {m["name"] for m in stack.api().get("/endpoints/test_model_sklearn").json()["metrics"]}
    run_typed(stack, workdir, COMMANDS["metrics"][2].replace("x0 x1", "x1 x2"))

"""ClearML Serving's own examples, their ``preprocess.py`` unchanged, deployed with our CLI (their flags),
each sent the request its README shows, over real sockets to a real stack (control plane, worker,
embedded Triton). Every answer is compared with running the same preprocess and model directly.

Tests share one stack and run in file order (the pipeline uses the sklearn endpoints).
"""
from __future__ import annotations

import gzip
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.serving.clearml import models
from tests.serving.clearml.models import EXAMPLES, example_module
from tests.serving.stack import Stack, make_stack

JSON = {"accept": "application/json", "Content-Type": "application/json"}
IMAGE = EXAMPLES / "pytorch" / "5.jpg"


def wait_ready(stack: Stack, endpoint: str, timeout: float = 90.0) -> None:
    url = f"{stack.worker_url()}/v2/models/{endpoint}/ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    status = httpx.get(f"{stack.worker_url()}/status", timeout=5).json()
    raise AssertionError(f"{endpoint} not ready after {timeout}s; worker status: {status}")


def serve(stack: Stack, endpoint: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{stack.worker_url()}/serve/{endpoint}", timeout=60, **kwargs)


def direct(preprocess_file: str, body, predict) -> object:
    """The reference: the example's own preprocess -> the model run directly -> its postprocess."""
    user = example_module(preprocess_file).Preprocess()
    return user.postprocess(predict(user.preprocess(body, {}, None)), {}, None)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_model):
    out = tmp_path_factory.mktemp("clearml-models")
    hf_home = tmp_path_factory.mktemp("hf-home")
    models.seed_hf_cache(hf_home, tiny_model.tokenizer_dir)
    return {"out": out, "hf_home": hf_home, "sklearn": models.sklearn_logistic(out),
            "ensemble": models.sklearn_ensemble(out), "xgboost": models.xgboost_regressor(out),
            "lightgbm": models.lightgbm_multiclass(out), "custom": models.sklearn_logistic(out, n_features=3),
            "pytorch": models.mnist_cnn(out), "keras": models.mnist_dense(out),
            "huggingface": models.renamed_output(tiny_model.onnx_path, out)}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, built):
    s = make_stack(tmp_path_factory.mktemp("clearml-stack"), workers=1)
    s.env.update({"HF_HOME": str(built["hf_home"]), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    try:
        s.start_control_plane()
        s.start_triton()
        s.start_worker(0)
        yield s
    finally:
        s.stop_all()


def upload(stack: Stack, name: str, path, *extra: str) -> None:
    stack.cli("model", "upload", "--name", name, "--project", "serving examples", "--path", str(path), *extra)


def add(stack: Stack, *args: str) -> None:
    stack.cli("model", "add", *args)


# --- in-process engines -----------------------------------------------------------------------
def test_sklearn(stack, built):
    import joblib

    upload(stack, "sklearn-model", built["sklearn"])
    add(stack, "--engine", "sklearn", "--endpoint", "test_model_sklearn", "--preprocess",
        str(EXAMPLES / "sklearn/preprocess.py"), "--name", "sklearn-model", "--project", "serving examples")
    wait_ready(stack, "test_model_sklearn")
    r = serve(stack, "test_model_sklearn", headers=JSON, json={"x0": 1, "x1": 2})
    assert r.status_code == 200, r.text
    model = joblib.load(built["sklearn"])
    assert r.json() == direct("sklearn/preprocess.py", {"x0": 1, "x1": 2}, model.predict)
    # the same body gzip-encoded, as ClearML accepts it
    r = serve(stack, "test_model_sklearn", content=gzip.compress(b'{"x0": -9, "x1": 3}'),
              headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json() == direct("sklearn/preprocess.py", {"x0": -9, "x1": 3}, model.predict)


def test_ensemble(stack, built):
    import joblib

    upload(stack, "ensemble-vr", built["ensemble"], "--framework", "scikit-learn")
    add(stack, "--engine", "sklearn", "--endpoint", "test_model_ensemble", "--preprocess",
        str(EXAMPLES / "ensemble/preprocess.py"), "--name", "ensemble-vr")
    wait_ready(stack, "test_model_ensemble")
    r = serve(stack, "test_model_ensemble", headers=JSON, json={"x0": 1, "x1": 2})
    assert r.status_code == 200, r.text
    expected = direct("ensemble/preprocess.py", {"x0": 1, "x1": 2}, joblib.load(built["ensemble"]).predict)
    np.testing.assert_allclose(r.json()["y"], expected["y"], rtol=1e-12)


def test_xgboost(stack, built):
    import xgboost as xgb

    upload(stack, "xgb_model", built["xgboost"])
    add(stack, "--engine", "xgboost", "--endpoint", "test_model_xgb", "--preprocess",
        str(EXAMPLES / "xgboost/preprocess.py"), "--name", "xgb_model")
    wait_ready(stack, "test_model_xgb")
    body = {"x0": 1, "x1": 2, "x2": 3, "x3": 4}
    r = serve(stack, "test_model_xgb", headers=JSON, json=body)
    assert r.status_code == 200, r.text
    booster = xgb.Booster()
    booster.load_model(str(built["xgboost"]))
    np.testing.assert_allclose(r.json()["y"], direct("xgboost/preprocess.py", body, booster.predict)["y"], rtol=1e-6)


def test_lightgbm(stack, built):
    import lightgbm as lgb

    upload(stack, "lgbm_model", built["lightgbm"], "--framework", "lightgbm")
    add(stack, "--engine", "lightgbm", "--endpoint", "test_model_lgbm", "--preprocess",
        str(EXAMPLES / "lightgbm/preprocess.py"), "--name", "lgbm_model")
    wait_ready(stack, "test_model_lgbm")
    booster = lgb.Booster(model_file=str(built["lightgbm"]))
    for body in ({"x0": 1, "x1": 2, "x2": 3, "x3": 4}, {"x0": 6.5, "x1": 3, "x2": 5.5, "x3": 2}):
        r = serve(stack, "test_model_lgbm", headers=JSON, json=body)
        assert r.status_code == 200, r.text
        assert r.json() == direct("lightgbm/preprocess.py", body, booster.predict)


def test_auto_update_and_canary_by_prefix(stack, built):
    """`model auto-update --max-versions 2`, then `model canary --weights 0.1 0.9 --input-endpoint-prefix`:
    the newest two versions share traffic 10/90, and keep doing so as a new version is uploaded."""
    ep = "test_model_sklearn_auto"
    stack.cli("model", "auto-update", "--engine", "sklearn", "--endpoint", ep, "--preprocess",
              str(EXAMPLES / "sklearn/preprocess.py"), "--name", "sklearn-model", "--max-versions", "2")
    upload(stack, "sklearn-model", built["sklearn"])  # version 2
    stack.cli("model", "canary", "--endpoint", ep, "--weights", "0.1", "0.9", "--input-endpoint-prefix", ep)
    upload(stack, "sklearn-model", built["sklearn"])  # version 3: now versions 2 and 3 serve, 10/90
    routes = {t["version"]: t["weight"] for t in httpx.get(f"{stack.control_plane}/endpoints/{ep}", headers=stack.headers()).json()["targets"]}
    assert routes == pytest.approx({2: 10.0, 3: 90.0})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        versions = httpx.get(f"{stack.worker_url()}/status").json()["endpoints"].get(ep, {}).get("versions", [])
        if {v["version"] for v in versions} == {2, 3}:
            break
        time.sleep(0.2)
    wait_ready(stack, ep)
    served = [serve(stack, ep, headers=JSON, json={"x0": 1, "x1": 2}).headers["X-Model-Version"] for _ in range(300)]
    share = served.count("2") / len(served)
    assert set(served) == {"2", "3"}
    # 300 draws of p=0.1: 0.1 +- 4.5 standard deviations (0.017) fails by chance about once in 10^5 runs
    assert abs(share - 0.1) < 0.078, share
    # the other form: named versions of the endpoint, weights in that order
    stack.cli("model", "canary", "--endpoint", ep, "--weights", "0.3", "0.7", "--input-endpoints", f"{ep}/3", f"{ep}/2")
    routes = {t["version"]: t["weight"] for t in stack.api().get(f"/endpoints/{ep}").json()["targets"]}
    assert routes == pytest.approx({3: 30.0, 2: 70.0})
    other = stack.cli("model", "canary", "--endpoint", ep, "--weights", "1", "--input-endpoints", "elsewhere/1",
                      check=False)
    assert other.returncode != 0 and "other endpoints" in other.stdout + other.stderr


def test_custom_example_is_broken_on_current_numpy(stack, built):
    """Its preprocess calls np.float, removed in numpy 1.24: ClearML Serving fails on it the same way.
    The endpoint deploys and answers a 422 naming the error, exactly what running it directly raises."""
    upload(stack, "custom-model", built["custom"])
    add(stack, "--engine", "custom", "--endpoint", "test_model_custom", "--preprocess",
        str(EXAMPLES / "custom/preprocess.py"), "--name", "custom-model")
    wait_ready(stack, "test_model_custom")
    r = serve(stack, "test_model_custom", headers=JSON, json={"features": [1, 2, 3]})
    assert r.status_code == 422 and "np" in r.json()["error"] and "float" in r.json()["error"], r.text
    user = example_module("custom/preprocess.py").Preprocess()
    with pytest.raises(AttributeError, match="float"):
        user.preprocess({"features": [1, 2, 3]}, {}, None)


def test_template_endpoint_without_a_model(stack):
    add(stack, "--engine", "custom", "--endpoint", "test_template",
        "--preprocess", str(EXAMPLES / "preprocess_template/preprocess_template.py"))
    wait_ready(stack, "test_template")
    r = serve(stack, "test_template", headers=JSON, json={"x0": 1, "x1": [2, 3]})
    assert r.status_code == 200, r.text
    assert r.json() == direct("preprocess_template/preprocess_template.py", {"x0": 1, "x1": [2, 3]}, lambda d: d)


@pytest.mark.parametrize("engine,file", [("custom", "preprocess.py"), ("custom_async", "async_preprocess.py")])
def test_pipeline(stack, built, engine, file):
    """Two sklearn endpoints and a pipeline endpoint that calls both with send_request and averages."""
    import joblib

    for ep in ("test_model_sklearn_a", "test_model_sklearn_b"):
        add(stack, "--engine", "sklearn", "--endpoint", ep, "--preprocess", str(EXAMPLES / "sklearn/preprocess.py"),
            "--name", "sklearn-model")
    add(stack, "--engine", engine, "--endpoint", f"test_model_pipeline_{engine}", "--preprocess",
        str(EXAMPLES / "pipeline" / file))
    for ep in ("test_model_sklearn_a", "test_model_sklearn_b", f"test_model_pipeline_{engine}"):
        wait_ready(stack, ep)
    r = serve(stack, f"test_model_pipeline_{engine}", headers=JSON, json={"x0": 1, "x1": 2})
    assert r.status_code == 200, r.text
    y = joblib.load(built["sklearn"]).predict([[1, 2]])[0]
    assert r.json() == {"y": 0.5 * y + 0.5 * y}


# --- Triton engine, images as raw bytes -----------------------------------------------------------
def _onnx(path):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feed_name, array: sess.run(None, {feed_name: array})[0]


def test_pytorch_image_bytes(stack, built):
    upload(stack, "train-pytorch-model", built["pytorch"])
    add(stack, "--engine", "triton", "--endpoint", "test_model_pytorch", "--preprocess",
        str(EXAMPLES / "pytorch/preprocess.py"), "--name", "train-pytorch-model", "--project", "serving examples",
        "--input-size", "1", "28", "28", "--input-name", "INPUT__0", "--input-type", "float32",
        "--output-size", "-1", "10", "--output-name", "OUTPUT__0", "--output-type", "float32")
    wait_ready(stack, "test_model_pytorch")
    r = serve(stack, "test_model_pytorch", headers={"Content-Type": "image/jpeg"}, content=IMAGE.read_bytes())
    assert r.status_code == 200, r.text
    run = _onnx(built["pytorch"])
    expected = direct("pytorch/preprocess.py", IMAGE.read_bytes(), lambda x: run("INPUT__0", x.astype(np.float32)))
    assert r.json() == expected
    r = serve(stack, "test_model_pytorch", headers={"Content-Type": "image/jpeg"}, content=b"not an image")
    assert r.status_code == 422 and "Image could not be decoded" in r.json()["error"]


def test_keras_image_bytes(stack, built):
    upload(stack, "train-keras-model", built["keras"])
    add(stack, "--engine", "triton", "--endpoint", "test_model_keras", "--preprocess",
        str(EXAMPLES / "keras/preprocess.py"), "--name", "train-keras-model", "--project", "serving examples",
        "--input-size", "1", "784", "--input-name", "dense_input", "--input-type", "float32",
        "--output-size", "-1", "10", "--output-name", "activation_2", "--output-type", "float32")
    wait_ready(stack, "test_model_keras")
    r = serve(stack, "test_model_keras", headers={"Content-Type": "image/jpeg"}, content=IMAGE.read_bytes())
    assert r.status_code == 200, r.text
    run = _onnx(built["keras"])
    # the 28x28 image goes to the 784-wide input it was declared as (--input-size 1 784)
    expected = direct("keras/preprocess.py", IMAGE.read_bytes(),
                      lambda x: run("dense_input", x.reshape(1, 784).astype(np.float32)))
    assert r.json() == expected


HF_FLAGS = ("--input-size", "[-1, -1]", "[-1, -1]", "[-1, -1]", "--input-type", "int32", "int32", "int32",
            "--output-size", "[-1, 2]", "--output-type", "float32", "--output-name", "output")


def test_huggingface_inputs_bound_by_name(stack, built, tiny_model):
    """The example's preprocess returns [input_ids, token_type_ids, attention_mask]; the model takes
    input_ids, attention_mask, token_type_ids. Bound by the declared names, the logits are right."""
    from transformers import AutoTokenizer

    upload(stack, "transformer-onnx", built["huggingface"])
    preprocess = str(EXAMPLES / "huggingface/preprocess.py")
    wrong = stack.cli("model", "add", "--engine", "triton", "--endpoint", "transformer_model", "--name",
                      "transformer-onnx", "--preprocess", preprocess, *HF_FLAGS,
                      "--input-name", "input_ids", "token_type_ids", "attention_masks", check=False)
    assert wrong.returncode != 0 and "attention_masks" in wrong.stdout + wrong.stderr and "422" in wrong.stdout + wrong.stderr
    add(stack, "--engine", "triton", "--endpoint", "transformer_model", "--name", "transformer-onnx",
        "--preprocess", preprocess, *HF_FLAGS, "--input-name", "input_ids", "token_type_ids", "attention_mask")
    wait_ready(stack, "transformer_model")
    text = "This is a ClearML example to show how Triton binaries are deployed."
    r = serve(stack, "transformer_model", headers=JSON, json={"text": text})
    assert r.status_code == 200, r.text
    tok = AutoTokenizer.from_pretrained(str(tiny_model.tokenizer_dir))(text=text, max_length=16, truncation=True,
                                                                       return_tensors="np")
    sess = ort.InferenceSession(str(built["huggingface"]), providers=["CPUExecutionProvider"])
    logits = sess.run(["output"], {i.name: tok[i.name].astype(np.int64) for i in sess.get_inputs()})[0]
    np.testing.assert_allclose(r.json()["data"], logits.tolist(), atol=1e-4)
    swapped = sess.run(["output"], {"input_ids": tok["input_ids"], "attention_mask": tok["token_type_ids"],
                                    "token_type_ids": tok["attention_mask"]})[0]
    assert not np.allclose(swapped, logits, atol=1e-4), "the test model must tell a swap apart"


def test_metrics_add_with_clearml_syntax(stack):
    stack.cli("metrics", "add", "--endpoint", "test_model_sklearn/1", "--variable-scalar",
              "x0=0,0.1,0.5,1,10", "x1=0,0.1,0.5,1,10")
    listed = stack.cli("metrics", "list", "--json").stdout
    assert '"x0"' in listed and '"x1"' in listed and "test_model_sklearn" in listed
    stack.cli("metrics", "remove", "--endpoint", "test_model_sklearn/*", "--variable", "x0", "x1")
    metrics = httpx.get(f"{stack.control_plane}/endpoints/test_model_sklearn", headers=stack.headers()).json()["metrics"]
    assert metrics == []

"""ClearML Serving's own examples, their ``preprocess.py`` unchanged, deployed with each README's own
``model upload`` / ``model add`` / ``auto-update`` / ``canary`` commands exactly as typed there (names
with spaces, ``--project``, quoted ``--aux-config``): only ``clearml-serving --id <service_id>`` becomes
``serving``. Each command line is split as a shell splits it (shlex) and run from a folder holding
``examples/``, over real sockets to a real stack (control plane, worker, embedded Triton). Every answer
is compared with running the same preprocess and model directly.

Tests share one stack and run in file order (the pipeline uses the sklearn endpoints; keras' and
lightgbm's READMEs both auto-update an endpoint named ``test_model_auto``).
"""
from __future__ import annotations

import gzip
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.serving.clearml import models
from tests.serving.clearml.models import EXAMPLES, example_module
from tests.serving.stack import Stack, make_stack

JSON = {"accept": "application/json", "Content-Type": "application/json"}
IMAGE = EXAMPLES / "pytorch" / "5.jpg"
SOURCE = "allegroai/clearml-serving@9f51a93, examples/<name>/readme.md"  # where each line below is copied from

# Each README's commands, as typed there (inline code spanning lines is one command).
README: dict[str, list[str]] = {
    "sklearn": [
        'clearml-serving --id <service_id> model add --engine sklearn --endpoint "test_model_sklearn" --preprocess "examples/sklearn/preprocess.py" --name "train sklearn model - sklearn-model" --project "serving examples"',  # noqa: E501
        'clearml-serving --id <service_id> model auto-update --engine sklearn --endpoint "test_model_sklearn_auto" --preprocess "examples/sklearn/preprocess.py" --name "train sklearn model - sklearn-model" --project "serving examples" --max-versions 2',  # noqa: E501
        'clearml-serving --id <service_id> model canary --endpoint "test_model_sklearn_auto" --weights 0.1 0.9 --input-endpoint-prefix test_model_sklearn_auto',  # noqa: E501
    ],
    "ensemble": [
        'clearml-serving --id <service_id> model add --engine sklearn --endpoint "test_model_ensemble" --preprocess "examples/ensemble/preprocess.py" --name "train model ensemble" --project "serving examples"',  # noqa: E501
        'clearml-serving --id <service_id> model auto-update --engine sklearn --endpoint "test_model_ensemble_auto" --preprocess "examples/ensemble/preprocess.py" --name "train model ensemble" --project "serving examples" --max-versions 2',  # noqa: E501
        'clearml-serving --id <service_id> model canary --endpoint "test_model_ensemble_auto" --weights 0.1 0.9 --input-endpoint-prefix test_model_ensemble_auto',  # noqa: E501
    ],
    "xgboost": [
        'clearml-serving --id <service_id> model add --engine xgboost --endpoint "test_model_xgb" --preprocess "examples/xgboost/preprocess.py" --name "train xgboost model - xgb_model" --project "serving examples"',  # noqa: E501
        'clearml-serving --id <service_id> model auto-update --engine xgboost --endpoint "test_model_xgb_auto" --preprocess "examples/xgboost/preprocess.py" --name "train xgboost model - xgb_model" --project "serving examples" --max-versions 2',  # noqa: E501
        'clearml-serving --id <service_id> model canary --endpoint "test_model_xgb_auto" --weights 0.1 0.9 --input-endpoint-prefix test_model_xgb_auto',  # noqa: E501
    ],
    "lightgbm": [
        'clearml-serving --id <service_id> model add --engine lightgbm --endpoint "test_model_lgbm" --preprocess "examples/lightgbm/preprocess.py" --name "train lightgbm model - lgbm_model" --project "serving examples"',  # noqa: E501
        'clearml-serving --id <service_id> model auto-update --engine lightgbm --endpoint "test_model_auto" --preprocess "examples/lightgbm/preprocess.py" --name "train lightgbm model - lgbm_model" --project "serving examples" --max-versions 2',  # noqa: E501
        'clearml-serving --id <service_id> model canary --endpoint "test_model_auto" --weights 0.1 0.9 --input-endpoint-prefix test_model_auto',  # noqa: E501
    ],
    "custom": [
        'clearml-serving --id <service_id> model add --engine custom --endpoint "test_model_custom" --preprocess "examples/custom/preprocess.py" --name "custom train model" --project "serving examples"',  # noqa: E501
        'clearml-serving --id <service_id> model auto-update --engine custom --endpoint "test_model_custom_auto" --preprocess "examples/custom/preprocess.py" --name "custom train model" --project "serving examples" --max-versions 2',  # noqa: E501
        'clearml-serving --id <service_id> model canary --endpoint "test_model_custom_auto" --weights 0.1 0.9 --input-endpoint-prefix test_model_custom_auto',  # noqa: E501
    ],
    "pipeline": [
        'clearml-serving --id <service_id> model add --engine sklearn --endpoint "test_model_sklearn_a" --preprocess "examples/sklearn/preprocess.py" --name "train sklearn model" --project "serving examples"',  # noqa: E501
        'clearml-serving --id <service_id> model add --engine sklearn --endpoint "test_model_sklearn_b" --preprocess "examples/sklearn/preprocess.py" --name "train sklearn model" --project "serving examples"',  # noqa: E501
        'clearml-serving --id <service_id> model add --engine custom --endpoint "test_model_pipeline" --preprocess "examples/pipeline/preprocess.py"',  # noqa: E501
        'clearml-serving --id <service_id> model add --engine custom_async --endpoint "test_model_pipeline" --preprocess "examples/pipeline/async_preprocess.py"',  # noqa: E501
    ],
    "pytorch": [
        '''clearml-serving --id <service_id> model add --engine triton --endpoint "test_model_pytorch" --preprocess "examples/pytorch/preprocess.py" --name "train pytorch model" --project "serving examples"
  --input-size 1 28 28 --input-name "INPUT__0" --input-type float32
  --output-size -1 10 --output-name "OUTPUT__0" --output-type float32
''',
        '''clearml-serving --id <service_id> model auto-update --engine triton --endpoint "test_model_pytorch_auto" --preprocess "examples/pytorch/preprocess.py" --name "train pytorch model" --project "serving examples" --max-versions 2
  --input-size 1 28 28 --input-name "INPUT__0" --input-type float32
  --output-size -1 10 --output-name "OUTPUT__0" --output-type float32''',
        'clearml-serving --id <service_id> model canary --endpoint "test_model_pytorch_auto" --weights 0.1 0.9 --input-endpoint-prefix test_model_pytorch_auto',  # noqa: E501
    ],
    "keras": [
        '''clearml-serving --id <service_id> model add --engine triton --endpoint "test_model_keras" --preprocess "examples/keras/preprocess.py" --name "train keras model - serving_model" --project "serving examples" --input-size 1 784 --input-name "dense_input" --input-type float32 --output-size -1 10 --output-name "activation_2" --output-type float32
''',
        '''clearml-serving --id <service_id> model auto-update --engine triton --endpoint "test_model_auto" --preprocess "examples/keras/preprocess.py" --name "train keras model - serving_model" --project "serving examples" --max-versions 2
  --input-size 1 784 --input-name "dense_input" --input-type float32
  --output-size -1 10 --output-name "activation_2" --output-type float32''',
        'clearml-serving --id <service_id> model canary --endpoint "test_model_auto" --weights 0.1 0.9 --input-endpoint-prefix test_model_auto',  # noqa: E501
    ],
    "huggingface": [
        'clearml-serving --id <your_service_ID> model upload --name "Transformer ONNX" --project "Hugginface Serving" --path model.bin',  # noqa: E501
        # Without dynamic batching
        r'clearml-serving --id <your_service_ID> model add --engine triton --endpoint "transformer_model" --model-id <your_model_ID> --preprocess examples/huggingface/preprocess.py --input-size "[-1, -1]" "[-1, -1]" "[-1, -1]" --input-type int32 int32 int32 --input-name "input_ids" "token_type_ids" "attention_mask" --output-size "[-1, 2]" --output-type float32 --output-name "output" --aux-config platform=\"tensorrt_plan\" default_model_filename=\"model.bin\"',  # noqa: E501
        # With dynamic batching
        r'clearml-serving --id <your_service_ID> model add --engine triton --endpoint "transformer_model" --model-id <your_model_ID> --preprocess examples/huggingface/preprocess.py --input-size "[-1]" "[-1]" "[-1]" --input-type int32 int32 int32 --input-name "input_ids" "token_type_ids" "attention_mask" --output-size "[2]" --output-type float32 --output-name "output" --aux-config platform=\"onnxruntime_onnx\" default_model_filename=\"model.bin\" dynamic_batching.preferred_batch_size="[1,2,4,8,16,32,64]" dynamic_batching.max_queue_delay_microseconds=5000000 max_batch_size=64',  # noqa: E501
    ],
}

# What each example's train script registers in ClearML (its README's name and project), uploaded here in its
# place: our stand-in for `python examples/<name>/train_model.py`, which needs a ClearML server.
TRAINED = {"sklearn": ("train sklearn model - sklearn-model", "sklearn-model.pkl"),
           "ensemble": ("train model ensemble", "ensemble-vr.pkl"),
           "xgboost": ("train xgboost model - xgb_model", "xgb_model.json"),
           "lightgbm": ("train lightgbm model - lgbm_model", "lgbm_model.txt"),
           "custom": ("custom train model", "custom-model.pkl"),
           "pipeline": ("train sklearn model", "sklearn-model.pkl"),
           "pytorch": ("train pytorch model", "mnist.onnx"),
           "keras": ("train keras model - serving_model", "mnist-dense.onnx")}


def as_typed(line: str, **placeholders: str) -> list[str]:
    """The README's line as a shell splits it, ``clearml-serving --id <...>`` becoming ``serving``."""
    line = re.sub(r"^clearml-serving --id <[A-Za-z_]+> ", "serving ", line.strip())
    for placeholder, value in placeholders.items():
        line = line.replace(placeholder, value)
    argv = shlex.split(line)
    assert argv[0] == "serving", line
    return argv


def run_typed(stack: Stack, workdir: Path, line: str, check: bool = True, **placeholders: str) -> subprocess.CompletedProcess:
    argv = as_typed(line, **placeholders)
    script = Path(sys.executable).with_name("serving")
    cmd = [str(script), *argv[1:]] if script.exists() else [sys.executable, "-m", "serving.cli.main", *argv[1:]]
    res = subprocess.run(cmd, env=stack.env, cwd=workdir, capture_output=True, text=True, timeout=180)
    if check and res.returncode != 0:
        raise AssertionError(f"{line}\nfailed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def upload_trained(stack: Stack, workdir: Path, example: str) -> None:
    name, file = TRAINED[example]
    run_typed(stack, workdir, f'serving model upload --name "{name}" --project "serving examples" --path {file}')


def wait_ready(stack: Stack, endpoint: str, versions: set[int] | None = None, timeout: float = 120.0) -> None:
    """The worker has the control plane's current revision, and the endpoint is ready (serving exactly
    ``versions`` when given)."""
    url = f"{stack.worker_url()}/v2/models/{endpoint}/ready"
    revision = stack.api().get("/health").json()["revision"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"{stack.worker_url()}/status", timeout=5).json()
            served = {v["version"] for v in status["endpoints"].get(endpoint, {}).get("versions", [])}
            if status["revision"] >= revision and (versions is None or served == versions) \
                    and httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    status = httpx.get(f"{stack.worker_url()}/status", timeout=5).json()
    raise AssertionError(f"{endpoint} not ready (versions {versions}) after {timeout}s; worker status: {status}")


def serve(stack: Stack, endpoint: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{stack.worker_url()}/serve/{endpoint}", timeout=60, **kwargs)


def direct(preprocess_file: str, body, predict) -> object:
    """The reference: the example's own preprocess -> the model run directly -> its postprocess."""
    user = example_module(preprocess_file).Preprocess()
    return user.postprocess(predict(user.preprocess(body, {}, None)), {}, None)


def routes(stack: Stack, endpoint: str) -> dict[int, float]:
    return {t["version"]: t["weight"] for t in stack.api().get(f"/endpoints/{endpoint}").json()["targets"]}


def auto_update_and_canary(stack: Stack, workdir: Path, example: str, check) -> None:
    """The README's auto-update, a second trained version, then its canary: versions 1 and 2 share 10/90,
    and every answer of the auto endpoint is the model's (both versions are the same model)."""
    _, auto_update, canary = README[example]
    endpoint = as_typed(auto_update)[as_typed(auto_update).index("--endpoint") + 1]
    run_typed(stack, workdir, auto_update)
    upload_trained(stack, workdir, example)  # version 2
    run_typed(stack, workdir, canary)
    assert routes(stack, endpoint) == pytest.approx({1: 10.0, 2: 90.0})
    wait_ready(stack, endpoint, {1, 2})
    seen = set()
    for _ in range(10):
        r = check(endpoint)
        seen.add(r.headers.get("X-Model-Version", "1"))
    assert seen <= {"1", "2"}


def as_the_readme_says(stack: Stack, workdir: Path, example: str, check) -> None:
    """The trained model, the README's `model add` and a check of its endpoint, then its auto-update and canary."""
    upload_trained(stack, workdir, example)
    add = README[example][0]
    endpoint = as_typed(add)[as_typed(add).index("--endpoint") + 1]
    run_typed(stack, workdir, add)
    wait_ready(stack, endpoint)
    check(endpoint)
    auto_update_and_canary(stack, workdir, example, check)


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
def workdir(tmp_path_factory, built) -> Path:
    """Where the READMEs' commands run: ``examples/`` (ClearML's repository root) and the model files."""
    work = tmp_path_factory.mktemp("clearml-checkout")
    (work / "examples").symlink_to(EXAMPLES, target_is_directory=True)
    for example, (_, file) in TRAINED.items():
        shutil.copy(built["sklearn" if example == "pipeline" else example], work / file)
    shutil.copy(built["huggingface"], work / "model.bin")  # the README's `curl ... -o model.bin`
    return work


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


# --- in-process engines -----------------------------------------------------------------------
def test_sklearn(stack, workdir, built):
    import joblib

    upload_trained(stack, workdir, "sklearn")
    run_typed(stack, workdir, README["sklearn"][0])
    wait_ready(stack, "test_model_sklearn")
    r = serve(stack, "test_model_sklearn", headers=JSON, json={"x0": 1, "x1": 2})
    assert r.status_code == 200, r.text
    model = joblib.load(built["sklearn"])
    assert r.json() == direct("sklearn/preprocess.py", {"x0": 1, "x1": 2}, model.predict)
    # the same body gzip-encoded, as ClearML accepts it
    r = serve(stack, "test_model_sklearn", content=gzip.compress(b'{"x0": -9, "x1": 3}'),
              headers={**JSON, "Content-Encoding": "gzip"})
    assert r.status_code == 200 and r.json() == direct("sklearn/preprocess.py", {"x0": -9, "x1": 3}, model.predict)


def test_sklearn_auto_update_and_canary(stack, workdir, built):
    """The README's auto-update then canary: the newest two versions share traffic 10/90, and keep doing
    so as a new version is uploaded."""
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


def test_ensemble(stack, workdir, built):
    import joblib

    body = {"x0": 1, "x1": 2}
    expected = direct("ensemble/preprocess.py", body, joblib.load(built["ensemble"]).predict)

    def check(ep: str) -> httpx.Response:
        r = serve(stack, ep, headers=JSON, json=body)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["y"], expected["y"], rtol=1e-12)
        return r

    as_the_readme_says(stack, workdir, "ensemble", check)


def test_xgboost(stack, workdir, built):
    import xgboost as xgb

    booster = xgb.Booster()
    booster.load_model(str(built["xgboost"]))
    body = {"x0": 1, "x1": 2, "x2": 3, "x3": 4}
    expected = direct("xgboost/preprocess.py", body, booster.predict)["y"]

    def check(ep: str) -> httpx.Response:
        r = serve(stack, ep, headers=JSON, json=body)
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["y"], expected, rtol=1e-6)
        return r

    as_the_readme_says(stack, workdir, "xgboost", check)


def test_lightgbm(stack, workdir, built):
    import lightgbm as lgb

    booster = lgb.Booster(model_file=str(built["lightgbm"]))
    bodies = ({"x0": 1, "x1": 2, "x2": 3, "x3": 4}, {"x0": 6.5, "x1": 3, "x2": 5.5, "x3": 2})

    def check(ep: str) -> httpx.Response:
        for body in bodies:
            r = serve(stack, ep, headers=JSON, json=body)
            assert r.status_code == 200, r.text
            assert r.json() == direct("lightgbm/preprocess.py", body, booster.predict)
        return r

    as_the_readme_says(stack, workdir, "lightgbm", check)


def test_custom_example_is_broken_on_current_numpy(stack, workdir):
    """Its preprocess calls np.float, removed in numpy 1.24: ClearML Serving fails on it the same way.
    Its endpoints deploy and answer a 422 naming the error, exactly what running it directly raises."""
    def check(ep: str) -> httpx.Response:
        r = serve(stack, ep, headers=JSON, json={"features": [1, 2, 3]})
        assert r.status_code == 422 and "np" in r.json()["error"] and "float" in r.json()["error"], r.text
        return r

    as_the_readme_says(stack, workdir, "custom", check)
    user = example_module("custom/preprocess.py").Preprocess()
    with pytest.raises(AttributeError, match="float"):
        user.preprocess({"features": [1, 2, 3]}, {}, None)


def test_template_endpoint_without_a_model(stack):
    """preprocess_template has no README; deployed as the pipeline README deploys a model-less endpoint."""
    stack.cli("model", "add", "--engine", "custom", "--endpoint", "test_template",
              "--preprocess", str(EXAMPLES / "preprocess_template/preprocess_template.py"))
    wait_ready(stack, "test_template")
    r = serve(stack, "test_template", headers=JSON, json={"x0": 1, "x1": [2, 3]})
    assert r.status_code == 200, r.text
    assert r.json() == direct("preprocess_template/preprocess_template.py", {"x0": 1, "x1": [2, 3]}, lambda d: d)


def test_pipeline(stack, workdir, built):
    """Two sklearn endpoints and a pipeline endpoint that calls both with send_request and averages: the
    threaded version, then the asyncio version on the same endpoint, as the README deploys them."""
    import joblib

    upload_trained(stack, workdir, "pipeline")
    add_a, add_b, threaded, asyncio_version = README["pipeline"]
    run_typed(stack, workdir, add_a)
    run_typed(stack, workdir, add_b)
    y = joblib.load(built["sklearn"]).predict([[1, 2]])[0]
    for line, engine in ((threaded, "custom"), (asyncio_version, "custom_async")):
        run_typed(stack, workdir, line)
        assert stack.api().get("/endpoints/test_model_pipeline").json()["engine"] == engine
        for ep in ("test_model_sklearn_a", "test_model_sklearn_b", "test_model_pipeline"):
            wait_ready(stack, ep)
        assert httpx.get(f"{stack.worker_url()}/status").json()["endpoints"]["test_model_pipeline"]["engine"] == engine
        r = serve(stack, "test_model_pipeline", headers=JSON, json={"x0": 1, "x1": 2})
        assert r.status_code == 200, r.text
        assert r.json() == {"y": 0.5 * y + 0.5 * y}


# --- Triton engine, images as raw bytes -----------------------------------------------------------
def _onnx(path):
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda feed_name, array: sess.run(None, {feed_name: array})[0]


def test_pytorch_image_bytes(stack, workdir, built):
    run = _onnx(built["pytorch"])
    expected = direct("pytorch/preprocess.py", IMAGE.read_bytes(), lambda x: run("INPUT__0", x.astype(np.float32)))

    def check(ep: str) -> httpx.Response:  # the README's `curl ... -H "Content-Type: image/jpeg" --data-binary "@5.jpg"`
        r = serve(stack, ep, headers={"Content-Type": "image/jpeg"}, content=IMAGE.read_bytes())
        assert r.status_code == 200 and r.json() == expected, r.text
        return r

    upload_trained(stack, workdir, "pytorch")
    run_typed(stack, workdir, README["pytorch"][0])
    wait_ready(stack, "test_model_pytorch")
    check("test_model_pytorch")
    r = serve(stack, "test_model_pytorch", headers={"Content-Type": "image/jpeg"}, content=b"not an image")
    assert r.status_code == 422 and "Image could not be decoded" in r.json()["error"]
    auto_update_and_canary(stack, workdir, "pytorch", check)


def test_keras_image_bytes(stack, workdir, built):
    run = _onnx(built["keras"])
    # the 28x28 image goes to the 784-wide input it was declared as (--input-size 1 784)
    expected = direct("keras/preprocess.py", IMAGE.read_bytes(),
                      lambda x: run("dense_input", x.reshape(1, 784).astype(np.float32)))

    def check(ep: str) -> httpx.Response:
        r = serve(stack, ep, headers={"Content-Type": "image/jpeg"}, content=IMAGE.read_bytes())
        assert r.status_code == 200 and r.json() == expected, r.text
        return r

    as_the_readme_says(stack, workdir, "keras", check)


def test_huggingface_as_typed(stack, workdir, built, tiny_model):
    """`model upload` prints the model id the README's `--model-id <your_model_ID>` takes; both `model add`
    commands run as typed, --aux-config with its escaped quotes and its list given as a string. The
    example's preprocess returns [input_ids, token_type_ids, attention_mask]; the model takes input_ids,
    attention_mask, token_type_ids: bound by the declared names, the logits are right."""
    from transformers import AutoTokenizer

    upload, without_batching, with_batching = README["huggingface"]
    printed = run_typed(stack, workdir, upload).stdout
    model_id = re.search(r"model id (\d+)", printed).group(1)
    text = "This is a ClearML example to show how Triton binaries are deployed."
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
    line = README["huggingface"][2].replace('"attention_mask"', '"attention_masks"')
    wrong = run_typed(stack, workdir, line, check=False, **{"<your_model_ID>": '"Transformer ONNX"'})  # a name works too
    assert wrong.returncode != 0 and "attention_masks" in wrong.stdout + wrong.stderr
    assert "422" in wrong.stdout + wrong.stderr


def test_metrics_add_with_clearml_syntax(stack):
    stack.cli("metrics", "add", "--endpoint", "test_model_sklearn/1", "--variable-scalar",
              "x0=0,0.1,0.5,1,10", "x1=0,0.1,0.5,1,10")
    listed = stack.cli("metrics", "list", "--json").stdout
    assert '"x0"' in listed and '"x1"' in listed and "test_model_sklearn" in listed
    stack.cli("metrics", "remove", "--endpoint", "test_model_sklearn/*", "--variable", "x0", "x1")
    metrics = httpx.get(f"{stack.control_plane}/endpoints/test_model_sklearn", headers=stack.headers()).json()["metrics"]
    assert metrics == []

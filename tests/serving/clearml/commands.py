"""ClearML Serving's command lines, typed against the fixtures in ``examples/``, and how to run them.

Each line is written as a ClearML Serving user types it (``clearml-serving --id <service_id>
model ...``, names with spaces, ``--project``, ``--aux-config`` with escaped quotes and lists as
strings, inline code broken over lines); only the program and its service id change
(``serving``). The line is split as a shell splits it (shlex) and run from a folder holding
``examples/``, so ``--preprocess "examples/sklearn/preprocess.py"`` resolves as typed.
"""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.serving.stack import Stack

CLI = "clearml-serving --id <service_id> "


def _flow(engine: str, endpoint: str, fixture: str, name: str, auto_endpoint: str, extra: str = "") -> list[str]:
    """``model add``, ``model auto-update --max-versions 2`` and ``model canary`` of one fixture."""
    common = f'--preprocess "examples/{fixture}" --name "{name}" --project "serving examples"'
    return [f'{CLI}model add --engine {engine} --endpoint "{endpoint}" {common}{extra}',
            f'{CLI}model auto-update --engine {engine} --endpoint "{auto_endpoint}" {common} --max-versions 2{extra}',
            f'{CLI}model canary --endpoint "{auto_endpoint}" --weights 0.1 0.9 --input-endpoint-prefix {auto_endpoint}']


PYTORCH_IO = '''
  --input-size 1 28 28 --input-name "INPUT__0" --input-type float32
  --output-size -1 10 --output-name "OUTPUT__0" --output-type float32'''
KERAS_IO = (' --input-size 1 784 --input-name "dense_input" --input-type float32'
            ' --output-size -1 10 --output-name "activation_2" --output-type float32')
HF_ADD = (r'clearml-serving --id <your_service_ID> model add --engine triton --endpoint "transformer_model" '
          r'--model-id <your_model_ID> --preprocess examples/huggingface/preprocess.py '
          r'--input-type int32 int32 int32 --input-name "input_ids" "token_type_ids" "attention_mask" '
          r'--output-type float32 --output-name "output" ')

COMMANDS: dict[str, list[str]] = {
    "sklearn": _flow("sklearn", "test_model_sklearn", "sklearn/preprocess.py",
                     "train sklearn model - sklearn-model", "test_model_sklearn_auto"),
    "ensemble": _flow("sklearn", "test_model_ensemble", "ensemble/preprocess.py", "train model ensemble",
                      "test_model_ensemble_auto"),
    "xgboost": _flow("xgboost", "test_model_xgb", "xgboost/preprocess.py", "train xgboost model - xgb_model",
                     "test_model_xgb_auto"),
    # lightgbm and keras auto-update one endpoint name between them, as ClearML users' scripts do
    "lightgbm": _flow("lightgbm", "test_model_lgbm", "lightgbm/preprocess.py", "train lightgbm model - lgbm_model",
                      "test_model_auto"),
    "custom": _flow("custom", "test_model_custom", "custom/preprocess.py", "custom train model",
                    "test_model_custom_auto"),
    "pipeline": [
        f'{CLI}model add --engine sklearn --endpoint "test_model_sklearn_a" --preprocess "examples/sklearn/preprocess.py" --name "train sklearn model" --project "serving examples"',  # noqa: E501
        f'{CLI}model add --engine sklearn --endpoint "test_model_sklearn_b" --preprocess "examples/sklearn/preprocess.py" --name "train sklearn model" --project "serving examples"',  # noqa: E501
        f'{CLI}model add --engine custom --endpoint "test_model_pipeline" --preprocess "examples/pipeline/preprocess.py"',
        f'{CLI}model add --engine custom_async --endpoint "test_model_pipeline" --preprocess "examples/pipeline/async_preprocess.py"',  # noqa: E501
    ],
    # flags continued on the next lines, as a multi-line snippet pasted into a shell with its breaks
    "pytorch": _flow("triton", "test_model_pytorch", "pytorch/preprocess.py", "train pytorch model",
                     "test_model_pytorch_auto", PYTORCH_IO),
    "keras": _flow("triton", "test_model_keras", "keras/preprocess.py", "train keras model - serving_model",
                   "test_model_auto", KERAS_IO),
    "huggingface": [
        'clearml-serving --id <your_service_ID> model upload --name "Transformer ONNX" --project "Huggingface Serving" --path model.bin',  # noqa: E501
        # without dynamic batching: a platform Triton would need for a TensorRT plan, ignored here
        HF_ADD + r'--input-size "[-1, -1]" "[-1, -1]" "[-1, -1]" --output-size "[-1, 2]" '
                 r'--aux-config platform=\"tensorrt_plan\" default_model_filename=\"model.bin\"',
        # with dynamic batching: the list given as a quoted string
        HF_ADD + r'--input-size "[-1]" "[-1]" "[-1]" --output-size "[2]" '
                 r'--aux-config platform=\"onnxruntime_onnx\" default_model_filename=\"model.bin\" '
                 r'dynamic_batching.preferred_batch_size="[1,2,4,8,16,32,64]" '
                 r'dynamic_batching.max_queue_delay_microseconds=5000000 max_batch_size=64',
    ],
    "metrics": [
        f'{CLI}metrics add --endpoint "test_model_sklearn/1" --variable-scalar "x0=0,0.1,0.5,1,10" "x1=0,0.1,0.5,1,10"',
        f'{CLI}metrics add --endpoint "test_model_custom/*" --variable-enum "label=left,right" '
        f'--variable-value "confidence" --variable-scalar "width=1,2,4,8"',
        f'{CLI}metrics remove --endpoint "test_model_sklearn/*" --variable x0 x1',
    ],
}

# The model each fixture's training would register in ClearML (name, file here), uploaded in its place.
TRAINED = {"sklearn": ("train sklearn model - sklearn-model", "sklearn-model.pkl"),
           "ensemble": ("train model ensemble", "ensemble-vr.pkl"),
           "xgboost": ("train xgboost model - xgb_model", "xgb_model.json"),
           "lightgbm": ("train lightgbm model - lgbm_model", "lgbm_model.txt"),
           "custom": ("custom train model", "custom-model.pkl"),
           "pipeline": ("train sklearn model", "sklearn-model.pkl"),
           "pytorch": ("train pytorch model", "digits-cnn.onnx"),
           "keras": ("train keras model - serving_model", "digits-dense.onnx")}


def as_typed(line: str, **placeholders: str) -> list[str]:
    """The line as a shell splits it, ``clearml-serving --id <...>`` becoming ``serving``."""
    line = re.sub(r"^clearml-serving --id <[A-Za-z_]+> ", "serving ", line.strip())
    for placeholder, value in placeholders.items():
        line = line.replace(placeholder, value)
    argv = shlex.split(line)
    assert argv[0] == "serving", line
    return argv


def endpoint_of(line: str) -> str:
    argv = as_typed(line)
    return argv[argv.index("--endpoint") + 1]


def run_typed(stack: Stack, workdir: Path, line: str, check: bool = True, **placeholders: str) -> subprocess.CompletedProcess:
    argv = as_typed(line, **placeholders)
    script = Path(sys.executable).with_name("serving")
    cmd = [str(script), *argv[1:]] if script.exists() else [sys.executable, "-m", "serving.cli.main", *argv[1:]]
    res = subprocess.run(cmd, env=stack.env, cwd=workdir, capture_output=True, text=True, timeout=180)
    if check and res.returncode != 0:
        raise AssertionError(f"{line}\nfailed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    return res


def upload_trained(stack: Stack, workdir: Path, fixture: str) -> None:
    name, file = TRAINED[fixture]
    run_typed(stack, workdir, f'serving model upload --name "{name}" --project "serving examples" --path {file}')


def wait_ready(stack: Stack, endpoint: str, versions: set[int] | None = None, timeout: float = 120.0,
               v2: bool = True) -> None:
    """The worker has the control plane's current revision, and the endpoint is ready (serving exactly
    ``versions`` when given): by the worker's readiness report, and by v2's ``/ready`` unless ``v2``
    is False."""
    url = f"{stack.worker_url()}/v2/models/{endpoint}/ready"
    revision = stack.api().get("/health").json()["revision"]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            status = httpx.get(f"{stack.worker_url()}/status", timeout=5).json()
            served = {v["version"] for v in status["endpoints"].get(endpoint, {}).get("versions", [])}
            reported = status["readiness"].get(endpoint, {}).get("state") == "ready"
            if status["revision"] >= revision and (versions is None or served == versions) and reported \
                    and (not v2 or httpx.get(url, timeout=5).status_code == 200):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    status = httpx.get(f"{stack.worker_url()}/status", timeout=5).json()
    raise AssertionError(f"{endpoint} not ready (versions {versions}) after {timeout}s; worker status: {status}")


def serve(stack: Stack, endpoint: str, **kwargs) -> httpx.Response:
    return httpx.post(f"{stack.worker_url()}/serve/{endpoint}", timeout=60, **kwargs)


def routes(stack: Stack, endpoint: str) -> dict[int, float]:
    return {t["version"]: t["weight"] for t in stack.api().get(f"/endpoints/{endpoint}").json()["targets"]}


def auto_update_and_canary(stack: Stack, workdir: Path, fixture: str, check, v2: bool = True) -> None:
    """The fixture's auto-update, a second upload, then its canary: versions 1 and 2 share 10/90, and
    every answer of the auto endpoint is the model's (both versions are the same model)."""
    _, auto_update, canary = COMMANDS[fixture]
    endpoint = endpoint_of(auto_update)
    run_typed(stack, workdir, auto_update)
    upload_trained(stack, workdir, fixture)  # version 2
    run_typed(stack, workdir, canary)
    assert routes(stack, endpoint) == pytest.approx({1: 10.0, 2: 90.0})
    wait_ready(stack, endpoint, {1, 2}, v2=v2)
    seen = {check(endpoint).headers.get("X-Model-Version", "1") for _ in range(10)}
    assert seen <= {"1", "2"}


def add_update_canary(stack: Stack, workdir: Path, fixture: str, check, v2: bool = True) -> None:
    """The trained model uploaded, the fixture's `model add` and a check of its endpoint, then its
    auto-update and canary."""
    upload_trained(stack, workdir, fixture)
    add = COMMANDS[fixture][0]
    run_typed(stack, workdir, add)
    wait_ready(stack, endpoint_of(add), v2=v2)
    check(endpoint_of(add))
    auto_update_and_canary(stack, workdir, fixture, check, v2=v2)

"""Which model formats an engine serves, checked when a model is uploaded and when it is deployed.

Uploading reads a Triton model (serving/triton/model_folder.py): its config.pbtxt against Triton's
schema, its files against its format's layout, its signature from config.pbtxt. Deploying on engine
``triton`` asks which Triton will run it. The rule: with ``SERVING_TRITON_MODEL_REPOSITORY`` set the
control plane writes an external Triton's repository, and that Triton (NVIDIA's image, every
backend) serves engine ``triton``; without it, engine ``triton`` is the embedded Triton, whose one
backend is Python: ONNX and Python-backend models only, anything else a 422 naming the format, the
backends there are and the way to an external Triton, at ``model add`` rather than as a load failure.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from registry import pytorch_models
from registry.errors import BadRequest, Unprocessable
from registry.signature import SignatureError, pytorch_kind
from serving.torchserve.archive import ArchiveError, is_archive, read_archive, requirements
from serving.triton.model_folder import ModelFolderError, describe
from serving.triton.model_formats import (
    FORMATS, TRITON_ONLY, TritonFormat, format_named, servable_formats, target_format, unservable_message,
)


# The engine a deploy without --engine gets for a model of these formats (triton for any other): an
# archive's handler is the archive's own way of serving it.
IMPLIED_ENGINES: dict[str, str] = {"torchserve": "torchserve",
                                   **pytorch_models.IMPLIED}  # PyTorch files: torch in the worker (--engine triton: Triton)


def implied_engine(framework: str | None) -> str:
    return IMPLIED_ENGINES.get(framework or "", "triton")


def upload_framework(path: Path, framework: str) -> str:
    """ClearML uploads TorchScript as ``--framework pytorch``: a TorchScript archive is Triton's
    ``pytorch_libtorch`` model whatever it was called; any other PyTorch file keeps its framework
    (and is refused with the ONNX export instructions)."""
    if is_archive(path):  # a TorchServe archive, whatever it was called: its handler serves it
        return "torchserve"
    if framework == "pytorch" and pytorch_kind(path) == "a TorchScript archive (torch.jit.save)":
        return "torchscript"
    return framework


def archive_signature(path: Path, allow_requirements: bool) -> dict[str, Any]:
    """A TorchServe archive's manifest and model-config.yaml (a 422 when it is not one TorchServe could
    load). Its requirements.txt is installed by the workers only where the operator allows per-model
    installs, as TorchServe's ``install_py_dep_per_model``; otherwise the upload is refused here."""
    try:
        info = read_archive(path)
    except ArchiveError as exc:
        raise Unprocessable(f"not a TorchServe archive the platform can serve: {exc}") from None
    if info.requirements_file and not allow_requirements:
        listed = ", ".join(requirements(path, info)) or "nothing"
        raise Unprocessable(
            f"the archive carries {info.requirements_file} ({listed}): per-model installs are off. Install those "
            "packages into the workers' image, or let the workers install them per model with "
            "SERVING_INSTALL_PY_DEP_PER_MODEL=true on the control plane and the workers (TorchServe's "
            "install_py_dep_per_model; docs/torchserve.md)")
    return info.signature()


def handler_preprocess(engine: str, asked: Any, current: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's preprocess entry: a TorchServe archive's handler does its own pre- and
    postprocessing, so engine torchserve's requests go to it whole (preprocess/handler.py)."""
    if engine != "torchserve":
        return {} if (current or {}).get("kind") == "handler" else current
    if asked is not None and asked.kind != "none":
        raise BadRequest("a TorchServe archive's handler does its own preprocessing: --tokenizer and --preprocess "
                         "do not apply to engine torchserve")
    return {"kind": "handler", "artifact": None, "options": {}}


def triton_signature(path: Path, framework: str) -> dict[str, Any]:
    """The signature of an uploaded Triton model of a format other than ONNX (SignatureError: a 422)."""
    try:
        return describe(path, framework)
    except ModelFolderError as exc:
        raise SignatureError(f"not {FORMATS[framework].words} Triton can load: {exc}") from None


def aux_format(aux_config: dict[str, str] | None) -> TritonFormat | None:
    """The format ClearML's ``--aux-config platform=... / backend=...`` names, if any."""
    aux = aux_config or {}
    if not (aux.get("platform") or aux.get("backend")):
        return None
    named = format_named(aux.get("platform", ""), aux.get("backend", ""))
    if named is None:
        raise Unprocessable(f"--aux-config platform={aux.get('platform', '')!r} backend={aux.get('backend', '')!r} "
                            f"names no model format served here ({', '.join(f.platform or f.backend for f in FORMATS.values())})")
    return named


def deployable_format(engine: str, framework: str, model_ref: str, triton_config: dict[str, Any] | None,
                      external_triton: bool) -> None:
    """Refuse a model its engine cannot serve: 400 for a format the engine never takes, 422 for a
    Triton format the embedded Triton has no backend for."""
    if engine == "onnxruntime" and framework != "onnx":
        raise BadRequest(f"engine onnxruntime serves ONNX models; {model_ref} is {framework}")
    if (engine == "torchserve") != (framework == "torchserve"):
        raise BadRequest(f"engine torchserve serves TorchServe archives (.mar) with their handlers; {model_ref} is "
                         f"{framework}" + (": deploy it with --engine torchserve (or no --engine)"
                                           if framework == "torchserve" else ""))
    pytorch_models.deployable(engine, framework, model_ref)
    if engine != "triton":
        return
    fmt = target_format(framework, triton_config)
    if fmt is None:
        raise BadRequest(f"engine triton serves ONNX models and Triton's other formats ({', '.join(TRITON_ONLY)}); "
                         f"{model_ref} is {framework}: upload it as one of them (`serving model upload` reads the "
                         "format from the file), or name its format with --aux-config platform=... or backend=...")
    if fmt.name not in servable_formats(external_triton):
        raise Unprocessable(unservable_message(fmt, model_ref))


def with_format(batching: dict[str, Any], framework: str, aux_config: dict[str, str] | None) -> dict[str, Any]:
    """The endpoint's batching, its config.pbtxt fields holding the platform/backend --aux-config
    names when the model's own format is unknown."""
    extra = endpoint_triton_config(framework, aux_config, dict(batching.get("triton_config") or {}))
    return {**batching, "triton_config": extra} if extra != (batching.get("triton_config") or {}) else batching


def endpoint_triton_config(framework: str, aux_config: dict[str, str] | None,
                           triton_config: dict[str, Any]) -> dict[str, Any]:
    """The endpoint's config.pbtxt fields, with the platform/backend --aux-config names when the model's
    own format is unknown (a model of known format keeps its own: those keys are ignored, as ClearML's
    READMEs write platform="onnxruntime_onnx" for ONNX files)."""
    named = aux_format(aux_config) if framework not in FORMATS else None
    if named is None:
        return triton_config
    return {**triton_config, **({"platform": named.platform} if named.platform else {}), "backend": named.backend}


def tensors_known(engine: str, model: Any, io: dict[str, Any] | None) -> None:
    """A Python-backend model.py uploaded without its config.pbtxt is served only when its tensors are
    known: declared by its own ``auto_complete_config`` (read at upload) or by the endpoint's
    ``--input-*``/``--output-*`` flags. Otherwise Triton would load it with zero inputs and refuse every
    request; a 422 at ``model add`` says what is missing instead."""
    if engine == pytorch_models.TORCH_ENGINE:  # forward()'s inputs: the signature's, else the declared ones
        return pytorch_models.tensors_known(model, io)
    signature = model.signature or {}
    if engine != "triton" or model.framework != "python" or "max_batch_size" in signature:
        return  # not a Python model, or its tensors came from a config.pbtxt or its auto_complete_config
    if signature.get("inputs") or (io or {}).get("inputs"):
        return
    unread = signature.get("auto_complete")
    raise Unprocessable(
        f"{model.name}:{model.version} is a Python-backend model.py uploaded without its config.pbtxt, and nothing "
        "declares its inputs and outputs" + (f" (its auto_complete_config cannot be read: {unread})" if unread else "")
        + ": Triton would load it with none and refuse every request. Upload its model folder (serving model upload "
        "--path MODEL_DIR, holding config.pbtxt and 1/model.py), declare the tensors in TritonPythonModel."
        "auto_complete_config, or name them here with --input-name/--input-type/--input-size and "
        "--output-name/--output-type/--output-size")

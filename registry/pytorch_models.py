"""The control plane's side of PyTorch versions served by engine ``torch`` (serving/pytorch/).

The control plane never loads a PyTorch model: a state dict's model file is user code, and importing
it here would run that code in the process holding the registry (serving/pytorch/__init__.py). It
checks what it can read without torch: an exported program is a ``.pt2`` archive, a state dict is
the archive ``serving model upload`` packs (serving/pytorch/archive.py). Their signature comes with
the upload (the CLI measured it on sample inputs); without one, engine ``torch`` serves the version
with the endpoint's declared tensors, and a deploy with neither is a 422 saying what to give.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from registry.errors import BadRequest, Unprocessable
from registry.signature import SignatureError
from serving.pytorch.archive import ArchiveError, read_manifest
from serving.pytorch.kinds import STATE_DICT, TORCH_EXPORT, TORCH_FRAMEWORKS, is_exported_program

TORCH_ENGINE = "torch"
CHECKED_UPLOADS = (TORCH_EXPORT, STATE_DICT)  # torchscript keeps Triton's check (registry/formats.py)
# what engine torch is for (registry/formats.py: IMPLIED_ENGINES)
IMPLIED = {name: TORCH_ENGINE for name in TORCH_FRAMEWORKS}


def upload_signature(path: Path, framework: str, given: dict[str, Any] | None) -> dict[str, Any]:
    """An upload of ``torch-export`` or ``pytorch-state-dict``: its artifact checked, its signature
    as sent (SignatureError: a 422)."""
    if framework == TORCH_EXPORT and not is_exported_program(path):
        raise SignatureError("framework torch-export takes a .pt2 exported program (torch.export.save); this file "
                             "is not one")
    if framework == STATE_DICT:
        try:
            read_manifest(path)
        except ArchiveError as exc:
            raise SignatureError(f"framework pytorch-state-dict takes the archive `serving model upload --path "
                                 f"WEIGHTS --model-file model.py` packs: {exc}") from None
    return given if given is not None else {"inputs": [], "outputs": []}


def deployable(engine: str, framework: str, model_ref: str) -> None:
    """Engine torch runs PyTorch versions only (a 400 naming what would)."""
    if engine == TORCH_ENGINE and framework not in TORCH_FRAMEWORKS:
        hint = ": deploy it on engine triton or onnxruntime" if framework == "onnx" else ""
        raise BadRequest(f"engine torch serves PyTorch models ({', '.join(TORCH_FRAMEWORKS)}); {model_ref} is "
                         f"{framework}{hint}")


def tensors_known(model: Any, io: dict[str, Any] | None) -> None:
    """Engine torch binds request tensors to forward()'s positional inputs by the signature's order:
    without a signature, the endpoint must declare them whole (names, types, sizes)."""
    if (model.signature or {}).get("inputs"):
        return
    declared = (io or {}).get("inputs") or []
    if declared and all(t.get("dtype") and t.get("shape") is not None for t in declared):
        return
    raise Unprocessable(
        f"{model.name}:{model.version} was uploaded without its inputs, and the endpoint declares none: engine torch "
        "cannot tell which tensors forward() takes. Upload it with `serving model upload --input-size ...` "
        "(--input-type, --input-name), or declare them here with --input-name/--input-type/--input-size")

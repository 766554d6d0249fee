"""Which kind of PyTorch file an upload is, read from its content (no torch import).

The registry's framework names for the versions the worker's ``torch`` engine serves:
``torchscript`` (also Triton's ``pytorch_libtorch`` format: serving/triton/model_formats.py),
``torch-export`` (a ``.pt2`` exported program) and ``pytorch-state-dict`` (a state dict packed with
its model file: archive.py).
"""
from __future__ import annotations

import zipfile
from pathlib import Path

from serving.triton.model_formats import is_torchscript

TORCHSCRIPT, TORCH_EXPORT, STATE_DICT = "torchscript", "torch-export", "pytorch-state-dict"
TORCH_FRAMEWORKS = (TORCHSCRIPT, TORCH_EXPORT, STATE_DICT)  # served by engine torch
WORDS = {TORCHSCRIPT: "a TorchScript archive (torch.jit.save)",
         TORCH_EXPORT: "an exported program (torch.export.save)",
         STATE_DICT: "a state dict with its model file"}


def is_exported_program(path: Path) -> bool:
    """``torch.export.save`` writes a zip whose ``<name>/archive_format`` member says ``pt2``."""
    try:
        with zipfile.ZipFile(path) as archive:
            marker = next((n for n in archive.namelist() if n == "archive_format" or n.endswith("/archive_format")),
                          None)
            return marker is not None and archive.read(marker).strip() == b"pt2"
    except (zipfile.BadZipFile, OSError, KeyError):
        return False


def file_kind(path: Path) -> str | None:
    """``torchscript`` or ``torch-export`` for a single file of that kind; None otherwise (a state dict
    alone is not servable: it needs its model file)."""
    path = Path(path)
    if not path.is_file():
        return None
    if is_exported_program(path):
        return TORCH_EXPORT
    if is_torchscript(path):
        return TORCHSCRIPT
    return None

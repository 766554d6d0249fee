"""A state dict and its model file as one artifact: an uncompressed tar (weights barely compress).

Members: ``model.py`` (the Python file defining the ``nn.Module`` class), the weights (``weights.pt``
written by ``torch.save``, or ``weights.safetensors``) and ``manifest.json`` naming the class and the
files. Times and owners are zeroed, so the same files give the same sha256 (the artifact store is
content-addressed). Reading it needs no torch and runs nothing: the control plane checks an upload's
layout with ``read_manifest``; the worker and the CLI build the module from ``read_archive``
(serving/pytorch/loading.py).
"""
from __future__ import annotations

import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path

MANIFEST, MODEL_FILE = "manifest.json", "model.py"
WEIGHT_FILES = ("weights.pt", "weights.safetensors")


class ArchiveError(ValueError):
    pass


@dataclass(frozen=True)
class StateDictArchive:
    model_class: str
    source: str  # the model file's text
    weights_name: str  # one of WEIGHT_FILES: how to read them
    weights: bytes


def pack(model_file: Path, weights: Path, model_class: str, safetensors: bool = False) -> bytes:
    """The artifact's bytes: the model file, the weights and the manifest, deterministically."""
    weights_name = WEIGHT_FILES[1] if safetensors else WEIGHT_FILES[0]
    manifest = {"format": "pytorch-state-dict", "class": model_class, "model_file": MODEL_FILE,
                "weights": weights_name, "source_names": {"model_file": model_file.name, "weights": weights.name}}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, MANIFEST, json.dumps(manifest, sort_keys=True, indent=1).encode())
        _add(tar, MODEL_FILE, model_file.read_bytes())
        _add(tar, weights_name, weights.read_bytes())
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def read_manifest(path: Path) -> dict:
    """The manifest, once the archive is checked to hold what it names (ArchiveError otherwise)."""
    try:
        with tarfile.open(path, mode="r:") as tar:
            names = set(tar.getnames())
            manifest = _manifest(tar, names)
    except (tarfile.TarError, OSError) as exc:
        raise ArchiveError(f"not a state-dict archive (a tar of {MANIFEST}, {MODEL_FILE} and weights): {exc}") from None
    return manifest


def _manifest(tar: tarfile.TarFile, names: set[str]) -> dict:
    if MANIFEST not in names:
        raise ArchiveError(f"not a state-dict archive: no {MANIFEST} (it holds {', '.join(sorted(names)[:8])})")
    try:
        manifest = json.loads(tar.extractfile(MANIFEST).read())
    except ValueError as exc:
        raise ArchiveError(f"{MANIFEST} is not JSON: {exc}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("class"), str) or not manifest["class"]:
        raise ArchiveError(f"{MANIFEST} names no model class")
    if manifest.get("weights") not in WEIGHT_FILES:
        raise ArchiveError(f"{MANIFEST}: weights must be one of {', '.join(WEIGHT_FILES)}")
    missing = [n for n in (MODEL_FILE, manifest["weights"]) if n not in names]
    if missing:
        raise ArchiveError(f"the archive lacks {', '.join(missing)}")
    return manifest


def read_archive(path: Path) -> StateDictArchive:
    manifest = read_manifest(path)
    with tarfile.open(path, mode="r:") as tar:
        source = tar.extractfile(MODEL_FILE).read().decode("utf-8")
        weights = tar.extractfile(manifest["weights"]).read()
    return StateDictArchive(manifest["class"], source, manifest["weights"], weights)

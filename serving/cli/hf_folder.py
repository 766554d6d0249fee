"""`serving model upload --path FOLDER`: a Hugging Face causal LM folder (config.json, safetensors weights,
tokenizer files, chat template) uploaded as one content-addressed version (serving/llm/folder.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from serving.cli.client import ControlPlane

FRAMEWORK = "hf-causal-lm"


def is_llm_folder(path: Path, framework: Optional[str]) -> bool:
    """A folder with config.json whose architectures are a causal LM, or any folder with --framework hf-causal-lm
    (the registry then says what vLLM would lack). Other Hugging Face folders keep the ONNX export advice."""
    if not path.is_dir() or not (path / "config.json").is_file():
        return False
    if framework is not None:
        return framework.strip().lower() == FRAMEWORK
    from serving.llm.checks import CAUSAL_SUFFIXES

    try:
        archs = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (ValueError, OSError, AttributeError):
        return False
    return any(isinstance(a, str) and a.endswith(CAUSAL_SUFFIXES) for a in archs)


def upload_folder(cp: ControlPlane, path: Path) -> str:
    """Stream the folder as one deterministic tar (progress over its total size); returns its sha256."""
    from serving.llm.folder import archive_folder

    archive = archive_folder(path)
    if not archive.files:
        raise typer.BadParameter(f"{path} has no files", param_hint="--path")
    return cp.upload_stream(archive.size, archive.chunks(), f"uploading {path.name}/ ({len(archive.files)} files)")

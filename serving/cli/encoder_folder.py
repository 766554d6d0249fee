"""The CLI's side of encoder endpoints (docs/embeddings.md): a sentence-transformers folder uploaded as
it is (exported to ONNX here: serving/embeddings/export.py), and an endpoint's encoder options from the
folder given as ``--tokenizer`` and the flags ``--task``, ``--pooling``, ``--normalize``."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

import typer

from preprocess.pooling import pooling_name
from preprocess.sentence_folder import EMBED, RERANK, TASKS, EncoderSpec, FolderError, read_folder
from serving.cli.output import console

DEFAULT_MAX_LENGTH = 512  # an encoder folder that names no length (BERT's position table)


def _spec(folder: Path) -> EncoderSpec | None:
    try:
        return read_folder(folder)
    except FolderError as exc:
        raise typer.BadParameter(f"{folder}: {exc}") from None


def exported_folder(path: Path, framework: Optional[str]) -> Path | None:
    """The ONNX file of a sentence-transformers folder with PyTorch/safetensors weights (exported and
    checked here), or None when ``path`` is not such a folder."""
    from registry.signature import pytorch_kind

    if not path.is_dir() or framework not in (None, "onnx"):
        return None
    spec = _spec(path)
    if spec is None or pytorch_kind(path) is None:
        return None
    from serving.embeddings.export import ExportError, export

    out = Path(tempfile.mkdtemp(prefix="serving-export-")) / "model.onnx"
    try:
        with console.status(f"exporting {path.name}/ to ONNX (torch.onnx.export) and checking it against PyTorch"):
            done = export(path, out, spec.task)
    except ExportError as exc:
        raise typer.BadParameter(str(exc), param_hint="--path") from None
    what = "a cross-encoder" if spec.task == RERANK else f"pooling {spec.pooling}" + (", normalized" if spec.normalize else "")
    console.print(f"exported {path} to ONNX ({done.output} out, {what}; onnxruntime matches PyTorch within "
                  f"{done.max_abs_diff:.1e}); deploy it with --tokenizer {path}")
    return done.path


def encoder_options(tokenizer: Path, task: Optional[str], pooling: Optional[str], normalize: Optional[bool],
                    max_length: Optional[int], max_batch_tokens: Optional[int]) -> dict[str, Any] | None:
    """An encoder endpoint's preprocess options, or None for a classifier (no encoder flag, and the
    tokenizer folder is no sentence-transformers folder). Flags win over the folder."""
    spec = _spec(tokenizer)
    if task is None and pooling is None and normalize is None and spec is None:
        return None
    task = task or (spec.task if spec else EMBED)
    if task not in TASKS:
        raise typer.BadParameter(f"--task must be one of {', '.join(TASKS)}", param_hint="--task")
    options: dict[str, Any] = spec.options() if spec is not None and spec.task == task else {"task": task}
    if task == EMBED:
        try:
            options["pooling"] = pooling_name(pooling) if pooling else options.get("pooling", "mean")
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--pooling") from None
        options["normalize"] = normalize if normalize is not None else options.get("normalize", False)
    elif pooling is not None or normalize is not None:
        raise typer.BadParameter("a cross-encoder (--task rerank) scores pairs: --pooling and --normalize are "
                                 "for embedding endpoints")
    options["max_length"] = max_length or options.get("max_length") or DEFAULT_MAX_LENGTH
    if max_batch_tokens:
        options["max_batch_tokens"] = max_batch_tokens
    return options

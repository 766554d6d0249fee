"""A sentence-transformers folder (PyTorch or safetensors weights) to the ONNX file the platform serves.

Why the platform exports it itself (``serving model upload --path FOLDER`` on the client) rather than
saying which command to run: the export of an encoder is always the same three lines (the
transformer, its inputs by name, ``last_hidden_state`` or the cross-encoder's ``logits`` out, both
axes dynamic), the folder says everything it needs, and a user who has a sentence-transformers
folder has torch installed already. Pooling and normalizing are not exported: the worker does them
(preprocess/pooling.py), so the same file serves any pooling and the token batcher pools each call.
Without torch (``pip install 'serving[models]'``) the upload stops and names that command, or
Optimum's (``optimum-cli export onnx --task feature-extraction``), whose output uploads as it is.

The export is checked before anything is uploaded: onnxruntime's answer on a sample must match
PyTorch's (max absolute difference under ``TOLERANCE``), or the upload stops with the figure.
"""
from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from preprocess.sentence_folder import RERANK

INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17
TOLERANCE = 1e-4
SAMPLE = ["a short sentence", "and a somewhat longer second sentence to pad against"]
NEEDS = ("exporting a sentence-transformers folder needs PyTorch: `pip install 'serving[models]'` (or export it "
         "yourself: `pip install optimum-onnx`, `optimum-cli export onnx --model FOLDER --task feature-extraction "
         "OUT/` (a cross-encoder: --task text-classification), then upload OUT/model.onnx)")


class ExportError(ValueError):
    pass


@dataclass(frozen=True)
class Exported:
    path: Path
    output: str
    inputs: tuple[str, ...]
    max_abs_diff: float


def _module(folder: Path, task: str) -> Any:
    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    kind = AutoModelForSequenceClassification if task == RERANK else AutoModel
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # a sentence-transformers folder often lacks the unused pooler: not news
    try:
        model = kind.from_pretrained(str(folder), local_files_only=True)
    finally:
        hf_logging.set_verbosity(verbosity)
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation("eager")  # plain ONNX ops
    model.eval()
    names = tuple(n for n in INPUTS if n in inspect.signature(model.forward).parameters)
    output = "logits" if task == RERANK else "last_hidden_state"

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *tensors: Any) -> Any:
            return getattr(self.model(**dict(zip(names, tensors))), output)

    return Encoder().eval(), names, output


def export(folder: Path, out: Path, task: str) -> Exported:
    """``out`` (a .onnx path) from ``folder``; ExportError when torch is missing or the check fails."""
    try:
        import torch
        from transformers import AutoTokenizer
    except ImportError:
        raise ExportError(NEEDS) from None
    module, names, output = _module(Path(folder), task)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    pairs = (SAMPLE, SAMPLE[::-1]) if task == RERANK else (SAMPLE,)
    sample = tokenizer(*pairs, padding=True, return_tensors="pt")
    if "token_type_ids" in names and "token_type_ids" not in sample:
        sample["token_type_ids"] = torch.zeros_like(sample["input_ids"])
    args = tuple(sample[n] for n in names)
    dynamic = {n: {0: "batch", 1: "sequence"} for n in names}
    dynamic[output] = {0: "batch"} if task == RERANK else {0: "batch", 1: "sequence"}
    out.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's notes on shape-dependent branches (constant here)
        torch.onnx.export(module, args, str(out), input_names=list(names), output_names=[output],
                          dynamic_axes=dynamic, opset_version=OPSET, do_constant_folding=True, dynamo=False)
        expected = module(*args).numpy()
    diff = _check(out, {n: sample[n].numpy() for n in names}, output, expected)
    if diff > TOLERANCE:
        raise ExportError(f"the exported model differs from PyTorch's by {diff:.2e} (over {TOLERANCE:g}) on a sample")
    return Exported(out, output, names, diff)


def _check(path: Path, feeds: dict[str, np.ndarray], output: str, expected: np.ndarray) -> float:
    from serving.ort import session

    got = session(path, 1).run([output], {k: v.astype(np.int64) for k, v in feeds.items()})[0]
    return float(np.max(np.abs(got - expected)))

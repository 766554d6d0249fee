"""The one way benchmarks load the ONNX model and tokenize, shared by the ceiling and Triton.

Same tokenizer settings everywhere (truncate at MAX_LENGTH, pad to the longest
text of the batch: dynamic padding), so systems differ only in how they serve.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.workloads import MAX_LENGTH
from serving.ort import providers


def session(onnx_path: Path, threads: int | None = None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or os.cpu_count() or 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(str(onnx_path), sess_options=opts, providers=providers())


def tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir), use_fast=True)


def classify(sess: Any, tok: Any, texts: list[str]) -> np.ndarray:
    """Texts -> predicted class ids: tokenize as a batch, run, argmax."""
    enc = tok(texts, padding="longest", truncation=True, max_length=MAX_LENGTH, return_tensors="np")
    wanted = {i.name for i in sess.get_inputs()}
    feeds = {k: v.astype(np.int64) for k, v in enc.items() if k in wanted}
    (logits,) = sess.run(["logits"], feeds)
    return logits.argmax(axis=-1)

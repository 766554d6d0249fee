"""The one way the serving processes open an onnxruntime session.

Shared by the worker's onnxruntime engine and the embedded Triton, so that both
pick the GPU when this onnxruntime build has one, and both stop idle intra-op
threads from spinning (on a small box they burn the CPU the other processes need).
GPU boxes install the ``gpu`` extra (onnxruntime-gpu, see pyproject.toml); nothing else changes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def providers() -> list[str]:
    """CUDA when this onnxruntime build has it (onnxruntime-gpu), so a GPU box needs no other
    setting; the CPU provider stays listed for the operators CUDA lacks."""
    import onnxruntime as ort

    available = ort.get_available_providers()
    return [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]


def session(path: Path, threads: int) -> Any:
    """A session whose ``run`` is thread-safe: one per model, shared by every thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), sess_options=options, providers=providers())


def string_feeds(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """BYTES tensors arrive as bytes objects (the v2 codec, gRPC, Triton's ``as_numpy``), and
    onnxruntime would take ``str()`` of each ("b'caf\\xc3\\xa9'" in the model): decode them as
    UTF-8, the only text a string tensor holds. A ValueError names an input that is not UTF-8."""
    feeds = {}
    for name, array in inputs.items():
        if array.dtype == np.object_ and array.size and isinstance(array.flat[0], (bytes, bytearray)):
            try:
                array = np.array([v.decode() if isinstance(v, (bytes, bytearray)) else v for v in array.ravel()],
                                 dtype=np.object_).reshape(array.shape)
            except UnicodeDecodeError as exc:
                raise ValueError(f"input {name!r}: a string tensor's elements must be UTF-8 text ({exc})") from None
        feeds[name] = array
    return feeds

"""The one way the serving processes open an onnxruntime session.

Shared by the worker's onnxruntime engine and the embedded Triton, so that both
pick the GPU when this onnxruntime build has one, and both stop idle intra-op
threads from spinning (on a small box they burn the CPU the other processes need).
GPU boxes install the ``gpu`` extra (onnxruntime-gpu, see pyproject.toml); nothing else changes.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any


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

"""Export a PyTorch model to ONNX and check that onnxruntime answers as torch does.

The exporter is PyTorch's TorchScript-based one (``dynamo=False``): it needs nothing beyond torch
(the dynamo exporter also needs ``onnxscript``), takes ScriptModules as they are (their control
flow becomes ONNX ``If``/``Loop``), and traces anything else. Tracing records one run: Python
control flow that depends on the data or on a shape is baked in for the sample it traced, which is
why the check runs the exported file on other batch sizes than the traced one and compares every
output with torch's own. Agreement means, element by element, ``|onnx - torch| <= ATOL + RTOL *
|torch|`` (numpy's ``allclose`` rule), with equal shapes, on every sample.
"""
from __future__ import annotations

import os
import sys
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from serving.pytorch.loading import flatten
from serving.pytorch.samples import InputSpec

ATOL = 1e-4
RTOL = 1e-4
OPSET = 17
TOLERANCE = f"{ATOL:.0e} abs + {RTOL:.0e} rel".replace("e-0", "e-")  # in words: 1e-4 abs + 1e-4 rel


class ExportFailed(Exception):
    """torch.onnx.export or onnxruntime could not handle the model; ``str()`` says why."""


@dataclass
class Agreement:
    agrees: bool
    max_abs_diff: float  # over every output and sample compared
    max_tolerance_ratio: float  # the worst |onnx - torch| / (ATOL + RTOL * |torch|); agreement: <= 1
    batch_sizes: list[int]
    atol: float = ATOL
    rtol: float = RTOL
    problem: str = ""  # the first disagreement, in words
    tracer_warnings: list[str] = field(default_factory=list)

    def as_metadata(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in ("", [])}


def export_onnx(model: Any, specs: Sequence[InputSpec], sample: Sequence[Any], output_names: Sequence[str],
                output_axes: dict[str, dict[int, str]], out: Path, trace_scripted: bool = False) -> list[str]:
    """Write ``out``; returns the tracer's warnings (what tracing may have baked in).

    ``trace_scripted``: trace a ScriptModule too, through :class:`Positional`, instead of exporting its
    scripted graph; for one returning a dict, which the exporter refuses (``prim::DictConstruct``)."""
    axes = {s.name: {j: d for j, d in enumerate(s.dims) if isinstance(d, str)} for s in specs}
    target = model if isinstance(model, torch.jit.ScriptModule) and not trace_scripted else Positional(model)
    with warnings.catch_warnings(record=True) as caught, _quiet_stdio():
        warnings.simplefilter("always")
        try:
            if isinstance(model, torch.jit.ScriptModule) and trace_scripted:  # the exporter cannot trace it itself
                target = torch.jit.trace(target, tuple(sample), check_trace=False)
            torch.onnx.export(target, tuple(sample), str(out), dynamo=False, input_names=[s.name for s in specs],
                              output_names=list(output_names), dynamic_axes={**axes, **output_axes},
                              opset_version=OPSET, do_constant_folding=True)
        except Exception as exc:  # the exporter raises many types (UnsupportedOperatorError, RuntimeError, ...)
            raise ExportFailed(f"torch.onnx.export failed: {type(exc).__name__}: {_first_line(exc)}") from None
    return sorted({_first_sentence(_first_line(w.message)) for w in caught
                   if issubclass(w.category, torch.jit.TracerWarning)})


def _first_line(exc: Any) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _first_sentence(text: str) -> str:
    return text.split(". ")[0].rstrip(".") + "."


@contextmanager
def _quiet_stdio() -> Iterator[None]:
    """The exporter's C++ side prints the whole graph to the process's stdout when it fails: the
    reason is in the exception, so file descriptors 1 and 2 point at /dev/null meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, devnull):
            os.close(fd)


class Positional(torch.nn.Module):
    """What the exporter traces: positional tensors in, a flat tuple out (dicts and nested tuples
    flattened as the worker flattens them). ``train()`` does nothing: the model is in eval mode
    already, and an exported program's module refuses to be switched."""

    def __init__(self, inner: Any) -> None:
        super().__init__()
        self.inner = inner

    def train(self, mode: bool = True) -> "Positional":
        return self

    def forward(self, *tensors: Any) -> tuple:
        return tuple(flatten(self.inner(*tensors)))


def check_agreement(path: Path, specs: Sequence[InputSpec], samples: Sequence[Sequence[Any]],
                    reference: Sequence[Sequence[np.ndarray]], output_names: Sequence[str], *, atol: float = ATOL,
                    rtol: float = RTOL, session: Any = None) -> Agreement:
    """onnxruntime on every sample against torch's outputs (``reference``, per sample in output order).
    ``session``: one the caller opened on ``path`` and goes on using (else one is opened here)."""
    if session is None:
        session = open_session(path, 1)
    batches = [int(sample[0].shape[0]) if sample and sample[0].dim() else 1 for sample in samples]
    result = Agreement(True, 0.0, 0.0, batches, atol=atol, rtol=rtol)
    for sample, expected, batch in zip(samples, reference, batches):
        feeds = {s.name: t.numpy() for s, t in zip(specs, sample)}
        try:
            got = session.run(list(output_names), feeds)
        except Exception as exc:  # a shape or op baked in for the traced batch fails on another one
            raise ExportFailed(f"onnxruntime fails on batch size {batch}: {_first_line(exc)}") from None
        for name, have, want in zip(output_names, got, expected):
            _compare(result, name, batch, np.asarray(have), want)
    return result


def open_session(path: Path, threads: int) -> Any:
    """An onnxruntime session on the exported file (serving/ort.py's settings); ExportFailed if it refuses it."""
    from serving.ort import session as ort_session

    try:
        return ort_session(path, threads)
    except Exception as exc:  # onnxruntime refuses a graph it cannot run
        raise ExportFailed(f"onnxruntime cannot load the exported model: {_first_line(exc)}") from None


def tolerance_text(atol: float, rtol: float) -> str:
    """A tolerance in words, as the reasons print it: ``1e-4 abs + 1e-4 rel``."""
    return f"{atol:.0e} abs + {rtol:.0e} rel".replace("e-0", "e-")


def _compare(result: Agreement, name: str, batch: int, have: np.ndarray, want: np.ndarray) -> None:
    if have.shape != want.shape:
        result.agrees = False
        result.problem = result.problem or (f"output {name!r} has shape {list(have.shape)} from onnxruntime, "
                                             f"{list(want.shape)} from torch, at batch size {batch}")
        return
    if not have.size:
        return
    a, b = have.astype(np.float64), want.astype(np.float64)
    diff = np.abs(a - b)
    ratio = float(np.max(diff / (result.atol + result.rtol * np.abs(b))))
    result.max_abs_diff = max(result.max_abs_diff, float(diff.max()))
    result.max_tolerance_ratio = max(result.max_tolerance_ratio, ratio)
    if not np.isfinite(ratio) or ratio > 1.0:
        result.agrees = False
        result.problem = result.problem or (f"output {name!r} differs from torch's by up to {float(diff.max()):.3g} "
                                            f"at batch size {batch} (tolerance "
                                            f"{tolerance_text(result.atol, result.rtol)})")

"""ONNX Runtime for a TorchServe archive's model, inside its unchanged handler (engine option ``runtime``).

Why: on the CPU onnxruntime runs the convolutional and linear models TorchServe archives hold about
2-3x as fast as torch (eager or TorchScript), and a TorchServe user brings handlers, not ONNX files.
So the handler stays exactly as archived (its preprocess, postprocess, explanations) and only the
model it calls is replaced: after the handler initialized, ``handler.model`` becomes an
:class:`OnnxProxy` around it. The first batch that reaches the model is answered by torch, as always,
and its real input is what the model is exported with (serving/pytorch/export.py: PyTorch's
TorchScript-based exporter, a dynamic batch dimension) and checked with: onnxruntime must give
torch's outputs on that batch and on one of another size, within ``ATOL + RTOL * |torch|`` element
by element, with the same output structure. Only then do later calls run onnxruntime; otherwise, or
when anything here fails, torch goes on answering and the reason is kept, logged and reported with
the answers' timings (serving/torchserve/handler_pool.py). Serving never breaks because of the swap.

What stays with torch for good (the reason says which): a function handler (no model object), a
model that is not a torch module or lives on a GPU (onnxruntime runs on the CPU here), a call with
keyword or non-tensor arguments, outputs other than tensors in tuples, lists or dicts, outputs whose
structure follows the batch size (a list per image), an export the exporter refuses, and answers
that disagree. Calls that do not fit the exported graph (another dtype, rank or fixed dimension, an
input that needs gradients as explanations do) go to torch one by one, and so does every call after
onnxruntime fails on one.
"""
from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from serving.pytorch.export import (ExportFailed, check_agreement, export_onnx, open_session, tolerance_text)
from serving.pytorch.loading import flatten
from serving.pytorch.samples import BATCH, TORCH_TO_TRITON, InputSpec, to_numpy

log = logging.getLogger(__name__)

RUNTIMES = ("torch", "onnx", "auto")
# Tighter than the upload check's 1e-4 abs: answers are to stay within 1e-5 of TorchServe's, and float32
# onnxruntime and torch kernels differ by 1e-7 to 3e-6 on the test archives' outputs (a few % of this).
ATOL = 1e-5
RTOL = 1e-4
_NO_NUMPY = (torch.bfloat16, torch.complex32)  # dtypes numpy (and so onnxruntime's Python API) lacks


class Refused(Exception):
    """The swap does not apply to this model; ``str()`` says why, for logs and reports."""


@dataclass
class SwapState:
    """What runs the handler's model, and why: what the handler process reports after each batch."""

    requested: str  # the engine option: "onnx" or "auto"
    runtime: str = "torch"  # what runs the model's calls from now on
    pending: bool = False  # waiting for the first batch to export with
    reason: str = ""
    agreement: dict[str, Any] = field(default_factory=dict)
    export_s: float = 0.0
    used: set[str] = field(default_factory=set)  # the runtimes that ran the model since the last report

    def settle(self, runtime: str, reason: str) -> None:
        """The decision, logged once: loudly when ``onnx`` was asked for and torch goes on."""
        self.runtime, self.reason, self.pending = runtime, reason, False
        if runtime == "onnx":
            log.info("the handler's model runs on onnxruntime: %s", reason)
        elif self.requested == "onnx":
            log.error("runtime onnx was asked for, but torch goes on running the handler's model: %s", reason)
        else:
            log.warning("runtime auto: torch goes on running the handler's model: %s", reason)

    def take(self) -> dict[str, Any]:
        """The report sent with a batch's answers; ``used`` starts again for the next batch."""
        report = {"runtime": self.runtime, "requested": self.requested, "pending": self.pending,
                  "reason": self.reason, "used": sorted(self.used)}
        if self.agreement:
            report["agreement"] = self.agreement
            report["export_s"] = round(self.export_s, 3)
        self.used = set()
        return report


def install(service: Any, requested: str, threads: int) -> SwapState | None:
    """Put an :class:`OnnxProxy` in place of the handler's model (after the handler initialized).
    None for ``torch`` (nothing changes); otherwise the state to report, torch with a reason when the
    handler has no model this can swap. Raises only for an unknown runtime (options.py checks it first):
    any failure here leaves the handler as it was."""
    if requested not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {requested!r}")
    if requested == "torch":
        return None
    state = SwapState(requested)
    try:
        handler = getattr(getattr(service, "_entry_point", None), "__self__", None)
        model = _swappable(handler)
        handler.model = OnnxProxy(model, state, max(1, threads))
    except Refused as exc:
        state.settle("torch", str(exc))
        return state
    except Exception as exc:  # an unusual handler object: it keeps its model
        state.settle("torch", f"the model could not be wrapped: {type(exc).__name__}: {_first_line(exc)}")
        return state
    state.pending = True
    state.reason = "the model is exported on the first batch that reaches it; torch answers until then"
    return state


def _swappable(handler: Any) -> torch.nn.Module:
    """The handler's model when the swap can apply to it; Refused saying why not."""
    if handler is None:
        raise Refused("a function handler (handle(data, context)) keeps its model to itself: nothing to swap")
    model = getattr(handler, "model", None)
    if model is None:
        raise Refused(f"the handler ({type(handler).__name__}) has no model (self.model) to swap")
    if not isinstance(model, torch.nn.Module):
        raise Refused(f"the handler's model is a {type(model).__name__}, not a torch module")
    devices = {t.device.type for t in (*model.parameters(), *model.buffers())}
    if devices - {"cpu"}:
        raise Refused(f"the model is on {', '.join(sorted(devices - {'cpu'}))}: {_gpu_note()}")
    return model


def _gpu_note() -> str:
    try:
        import onnxruntime

        gpu = "CUDAExecutionProvider" in onnxruntime.get_available_providers()
    except Exception:
        gpu = False
    if gpu:
        return ("onnxruntime-gpu is installed, but feeding it a GPU model's tensors through host memory on every "
                "batch is not done here; torch keeps the model on its GPU")
    return "onnxruntime here runs on the CPU only (onnxruntime-gpu is not installed); torch keeps the model on its GPU"


class OnnxProxy(torch.nn.Module):
    """What the handler calls instead of its model: torch until the swap is decided, then onnxruntime
    for the calls that fit the exported graph. Anything else the handler reads from its model
    (attributes, ``eval()``, ``to()``) reaches the model itself."""

    def __init__(self, inner: torch.nn.Module, state: SwapState, threads: int) -> None:
        super().__init__()
        self.inner = inner
        self.swap = state
        self.threads = threads
        self.runner: OnnxRunner | None = None

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name.startswith("__") or name == "_modules":
                raise
            return getattr(self._modules["inner"], name)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.runner is not None and not kwargs and self.runner.fits(args):
            try:
                out = self.runner.run(args)
            except Exception as exc:  # an input the two checked batches did not show: torch from now on
                self.runner = None
                self.swap.settle("torch", f"onnxruntime failed on a later batch ({type(exc).__name__}: "
                                          f"{_first_line(exc)}); torch runs the model from then on")
            else:
                self.swap.used.add("onnx")
                return out
        self.swap.used.add("torch")
        if self.swap.pending and not _wants_grad(args, kwargs):
            return self._first(args, kwargs)
        return self.inner(*args, **kwargs)

    def _first(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """torch answers the first batch; its input is then exported and checked (never raising)."""
        outputs = self.inner(*args, **kwargs)
        started = time.perf_counter()
        try:
            self.runner, agreement = build_runner(self.inner, args, kwargs, outputs, self.threads)
        except Refused as exc:
            self.swap.settle("torch", str(exc))
            return outputs
        except Exception as exc:  # whatever else went wrong: serving goes on with torch
            log.debug("the ONNX swap failed", exc_info=True)
            self.swap.settle("torch", f"the ONNX swap failed: {type(exc).__name__}: {_first_line(exc)}")
            return outputs
        self.swap.export_s = time.perf_counter() - started
        self.swap.agreement = agreement.as_metadata()
        self.swap.settle("onnx", f"exported to ONNX on the first batch; onnxruntime agrees with torch on batch sizes "
                                 f"{', '.join(map(str, agreement.batch_sizes))} (max |diff| "
                                 f"{agreement.max_abs_diff:.2g}, tolerance {tolerance_text(ATOL, RTOL)})")
        return outputs


def _wants_grad(args: tuple, kwargs: dict[str, Any]) -> bool:
    """An input needing gradients (captum's explanations): only torch can give them."""
    return any(isinstance(v, torch.Tensor) and v.requires_grad for v in (*args, *kwargs.values()))


# ------------------------------------------------------------------------------------------ the runner

@dataclass(frozen=True)
class _Input:
    name: str
    dtype: torch.dtype
    shape: tuple[int | None, ...]  # None: the dynamic batch dimension


@dataclass(frozen=True)
class _Out:
    """A tensor's place in the output structure: its index among the exported graph's outputs."""

    index: int


@dataclass
class OnnxRunner:
    """The exported graph's session and how to call it as the model is called."""

    session: Any
    inputs: list[_Input]
    output_names: list[str]
    output_dtypes: list[torch.dtype]
    skeleton: Any  # the model's output with each tensor replaced by an _Out

    def fits(self, args: Sequence[Any]) -> bool:
        """Whether a call's arguments are what the graph takes: CPU tensors of the exported dtypes and
        ranks, the fixed dimensions equal, none needing gradients."""
        if len(args) != len(self.inputs):
            return False
        for arg, want in zip(args, self.inputs):
            if (not isinstance(arg, torch.Tensor) or arg.dtype != want.dtype or arg.device.type != "cpu"
                    or arg.requires_grad or arg.dim() != len(want.shape)):
                return False
            if any(size is not None and size != have for size, have in zip(want.shape, arg.shape)):
                return False
        return True

    def run(self, args: Sequence[torch.Tensor]) -> Any:
        feeds = {want.name: np.ascontiguousarray(arg.detach().numpy()) for arg, want in zip(args, self.inputs)}
        got = self.session.run(self.output_names, feeds)
        tensors = [torch.from_numpy(np.asarray(array)).to(dtype) for array, dtype in zip(got, self.output_dtypes)]
        return rebuild(self.skeleton, tensors)


def build_runner(model: torch.nn.Module, args: tuple, kwargs: dict[str, Any], outputs: Any,
                 threads: int) -> tuple[OnnxRunner, Any]:
    """Export ``model`` with the first batch's ``args`` (torch gave ``outputs``), check onnxruntime on it
    and on a batch of another size; the runner and the agreement, or Refused saying why not."""
    _check_arguments(args, kwargs)
    with torch.inference_mode(False), torch.no_grad():  # export and compare outside the handler's inference mode
        runs = _torch_runs(model, args, outputs)
        specs = [InputSpec(f"input__{i}", TORCH_TO_TRITON[str(t.dtype)],
                           (BATCH if dyn else int(t.shape[0]), *map(int, t.shape[1:])) if t.dim() else ())
                 for i, (t, dyn) in enumerate(zip(runs.samples[0], runs.dynamic))]
        names = [f"output__{i}" for i in range(len(runs.reference[0]))]
        with tempfile.TemporaryDirectory(prefix="onnx-swap-") as tmp:
            path = Path(tmp) / "model.onnx"
            try:
                warned = export_onnx(model, specs, runs.samples[0], names, _output_axes(names, runs), path,
                                     trace_scripted=isinstance(model, torch.jit.ScriptModule) and not _flat(outputs))
                session = open_session(path, threads)
                agreement = check_agreement(path, specs, runs.samples, runs.reference, names, atol=ATOL, rtol=RTOL,
                                            session=session)
            except ExportFailed as exc:
                raise Refused(f"the ONNX export failed: {exc}") from None
    if not agreement.agrees:
        raise Refused(f"onnxruntime disagrees with torch: {agreement.problem}"
                      + (f"; tracing warned: {warned[0]}" if warned else ""))
    agreement.tracer_warnings = warned
    inputs = [_Input(s.name, t.dtype, tuple(None if dyn and j == 0 else int(d) for j, d in enumerate(t.shape)))
              for s, t, dyn in zip(specs, runs.samples[0], runs.dynamic)]
    return OnnxRunner(session, inputs, names, [t.dtype for t in flatten(outputs)], runs.skeleton), agreement


@dataclass
class _Runs:
    """torch on the first batch and on the same input at another batch size: what the export is checked on."""

    samples: list[list[torch.Tensor]]
    reference: list[list[np.ndarray]]  # per sample, the outputs in flatten order
    skeleton: Any
    dynamic: list[bool]  # per input: its first dimension is the batch's
    batches: tuple[int, ...]  # the batch size of each sample


def _torch_runs(model: torch.nn.Module, args: tuple, outputs: Any) -> _Runs:
    sample = [a.detach().clone().contiguous() for a in args]  # plain tensors: the handler's are inference tensors
    batch = _batch_size(sample)
    dynamic = [batch is not None and t.dim() > 0 and t.shape[0] == batch for t in sample]
    skeleton = _skeleton(outputs)  # first: it refuses outputs other than tensors
    runs = _Runs([sample], [[to_numpy(t) for t in flatten(outputs)]], skeleton, dynamic, ())
    if batch is None:  # no batch dimension to vary: the graph takes this shape only
        return runs
    other = _other_batch(sample, dynamic)
    try:
        other_out = model(*other)
    except Exception as exc:
        raise Refused(f"the model fails on a batch of {other[0].shape[0]} (checking that the batch size can vary): "
                      f"{type(exc).__name__}: {_first_line(exc)}") from None
    if _skeleton(other_out) != runs.skeleton:
        raise Refused("the model's output structure follows the batch size (e.g. a list per image): one exported "
                      "graph cannot return it")
    runs.samples.append(other)
    runs.reference.append([to_numpy(t) for t in flatten(other_out)])
    runs.batches = (batch, int(other[0].shape[0]))
    return runs


def _check_arguments(args: tuple, kwargs: dict[str, Any]) -> None:
    """The graph takes positional CPU tensors of dtypes numpy has: Refused naming what is not."""
    if kwargs:
        raise Refused(f"the handler calls the model with keyword arguments ({', '.join(kwargs)}): an exported graph "
                      "takes positional tensors")
    if not args:
        raise Refused("the handler calls the model without arguments")
    for i, arg in enumerate(args, 1):
        if not isinstance(arg, torch.Tensor):
            raise Refused(f"argument {i} of the model's call is a {type(arg).__name__}, not a tensor: an exported "
                          "graph takes tensors only")
        if arg.device.type != "cpu":
            raise Refused(f"argument {i} of the model's call is on {arg.device}: {_gpu_note()}")
        if arg.dtype in _NO_NUMPY or str(arg.dtype) not in TORCH_TO_TRITON:
            raise Refused(f"argument {i} of the model's call is {arg.dtype}, which onnxruntime's Python API cannot "
                          "take")


def _batch_size(sample: Sequence[torch.Tensor]) -> int | None:
    """The batch dimension: the first argument's first; None when it has none (then nothing is dynamic)."""
    return int(sample[0].shape[0]) if sample[0].dim() > 0 and sample[0].shape[0] > 0 else None


def _other_batch(sample: Sequence[torch.Tensor], dynamic: Sequence[bool]) -> list[torch.Tensor]:
    """The same input at another batch size, to check the exported batch dimension really varies:
    its first row when the batch has several, else the row twice."""
    def resized(t: torch.Tensor) -> torch.Tensor:
        return (t[:1] if t.shape[0] > 1 else torch.cat([t, t])).contiguous()

    return [resized(t) if dyn else t for t, dyn in zip(sample, dynamic)]


def _output_axes(names: Sequence[str], runs: _Runs) -> dict[str, dict[int, str]]:
    """Output dimensions whose size differs between the two checked batches are dynamic (named ``batch``
    when their sizes are the batches'); a rank that differs cannot be exported."""
    if len(runs.reference) < 2:
        return {}
    axes: dict[str, dict[int, str]] = {}
    for i, name in enumerate(names):
        first, second = runs.reference[0][i].shape, runs.reference[1][i].shape
        if len(first) != len(second):
            raise Refused(f"output {i} changes rank with the batch size ({list(first)} and {list(second)})")
        for j, (a, b) in enumerate(zip(first, second)):
            if a != b:
                axes.setdefault(name, {})[j] = BATCH if (a, b) == runs.batches else f"{name}_{j}"
    return axes


# -------------------------------------------------------------------------------- the output structure

def _skeleton(out: Any, counter: list[int] | None = None) -> Any:
    """``out`` with each tensor replaced by its index in flatten order (serving/pytorch/loading.py's:
    dict values, then tuple and list items, in order); Refused for anything else among the outputs."""
    counter = [0] if counter is None else counter
    if isinstance(out, torch.Tensor):
        counter[0] += 1
        return _Out(counter[0] - 1)
    if isinstance(out, dict):
        return type(out)((k, _skeleton(v, counter)) for k, v in out.items())
    if isinstance(out, (tuple, list)):
        items = [_skeleton(v, counter) for v in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)  # a namedtuple takes fields
    raise Refused(f"the model's outputs hold a value of type {type(out).__name__}; only tensors and tuples, lists "
                  "and dicts of them come back from an exported graph")


def rebuild(skeleton: Any, tensors: Sequence[torch.Tensor]) -> Any:
    """The model's output structure again, with onnxruntime's tensors in their places."""
    if isinstance(skeleton, _Out):
        return tensors[skeleton.index]
    if isinstance(skeleton, dict):
        return type(skeleton)((k, rebuild(v, tensors)) for k, v in skeleton.items())
    items = [rebuild(v, tensors) for v in skeleton]
    return type(skeleton)(*items) if hasattr(skeleton, "_fields") else type(skeleton)(items)


def _flat(out: Any) -> bool:
    """A tensor or a flat tuple of tensors: what a scripted graph can return to the exporter."""
    return isinstance(out, torch.Tensor) or (isinstance(out, tuple) and all(isinstance(t, torch.Tensor) for t in out))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:300]

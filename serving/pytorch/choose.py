"""Which runtime serves an uploaded PyTorch model, and why: ONNX where the export agrees with torch.

Why ONNX first: onnxruntime ran our CPU benchmark's model about 2.88x as fast as PyTorch, and an
ONNX version is served by every tensor engine (triton, embedded or external, and onnxruntime in the
worker). Torch (engine ``torch`` in the worker) is the fallback that always answers as the user's
own model does: where the export fails, or where onnxruntime's answers differ from torch's on the
samples (serving/pytorch/export.py), the version keeps its PyTorch file. ``runtime`` forces either:
``torch`` skips the export, ``onnx`` makes a failed or disagreeing export an error.

The outcome is a :class:`Prepared`: what to upload, its framework and signature, and the metadata
kept on the version (``{"pytorch": {"source", "runtime", "reason", "forced", "agreement", ...}}``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from serving.pytorch import archive
from serving.pytorch.export import TOLERANCE, ExportFailed, check_agreement, export_onnx
from serving.pytorch.kinds import STATE_DICT, TORCH_EXPORT, TORCHSCRIPT
from serving.pytorch.loading import (flatten, forward_names, load_module, load_program, module_from_source,
                                     output_keys, pick_class)
from serving.pytorch.samples import (InputSpec, SpecError, make_samples, output_specs, sample_sizes, specs_from_flags,
                                     specs_from_program, to_numpy)

RUNTIMES = ("auto", "onnx", "torch")


class RuntimeChoiceError(ValueError):
    """``--runtime onnx`` and the export failed or disagreed: the reason, for the user."""


@dataclass(frozen=True)
class InputFlags:
    """``serving model upload``'s ``--input-name/--input-type/--input-size`` and ``--output-name``."""

    names: Sequence[str] = ()
    types: Sequence[str] = ()
    sizes: Sequence[Sequence[int]] = ()
    output_names: Sequence[str] = ()

    @property
    def given(self) -> bool:
        return bool(self.names or self.types or self.sizes)


@dataclass
class Source:
    """A PyTorch upload opened: its kind, the file that goes up when torch serves it, the model."""

    kind: str
    path: Path
    model: Any
    specs: list[InputSpec] | None  # None: a TorchScript file without --input-size
    bounds: dict[str, tuple[int, int | None]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Prepared:
    framework: str  # "onnx", or the PyTorch kind (engine torch)
    path: Path  # what to upload
    signature: dict[str, Any] | None  # sent with a torch version; an ONNX file's is read from it
    runtime: str  # "onnx" | "torch"
    reason: str
    metadata: dict[str, Any]


def open_source(path: Path, kind: str, workdir: Path, flags: InputFlags, model_file: Path | None = None,
                model_class: str | None = None) -> Source:
    """Load the model as the worker would (serving/pytorch/loading.py) and describe its inputs."""
    if kind == TORCH_EXPORT:
        if flags.given:
            raise SpecError("a .pt2 carries its inputs (names, dtypes, dynamic dimensions): drop --input-name, "
                            "--input-type and --input-size")
        program = load_program(path)
        specs, bounds = specs_from_program(program)
        return Source(kind, path, program.module(), specs, bounds)
    if kind == STATE_DICT:
        assert model_file is not None
        module = module_from_source(model_file.read_text(), model_file.name)
        chosen = pick_class(module, model_class, str(model_file))
        packed = workdir / "model.tar"
        packed.write_bytes(archive.pack(model_file, path, chosen, safetensors=_is_safetensors(path)))
        model = load_module(packed, STATE_DICT)
        if not flags.sizes:
            raise SpecError("a state dict needs its inputs' sizes to be exported and checked: --input-size "
                            "(one example's dims, without the batch dimension), --input-type if not float32")
        return Source(kind, packed, model, _flag_specs(model, flags), details={"model_class": chosen})
    model = load_module(path, TORCHSCRIPT)
    return Source(kind, path, model, _flag_specs(model, flags) if flags.sizes else None)


def _is_safetensors(path: Path) -> bool:
    from registry.signature import pytorch_kind

    return pytorch_kind(path) == "a safetensors file"


def _flag_specs(model: Any, flags: InputFlags) -> list[InputSpec]:
    names = list(flags.names)
    if not names:
        params = forward_names(model)
        count = max(len(flags.sizes), len(flags.types), 1)
        if len(params) < count:
            raise SpecError(f"forward() takes {len(params)} tensor(s) ({', '.join(params)}); the flags describe "
                            f"{count}: name them with --input-name")
        names = params[:count]
    return specs_from_flags(names, flags.types, flags.sizes)


def decide(source: Source, runtime: str, workdir: Path, output_names: Sequence[str] = ()) -> Prepared:
    """Export and check unless ``runtime`` is ``torch``; RuntimeChoiceError when ``onnx`` cannot be had."""
    forced = runtime != "auto"
    base = {"source": source.kind, "forced": forced, **source.details}
    if source.specs is None:
        reason = ("no sample inputs to export and check it with (give --input-size, and --input-type or "
                  "--input-name where needed)")
        if runtime == "onnx":
            raise RuntimeChoiceError(f"--runtime onnx: {reason}")
        return _torch(source, None, f"{reason}; engine torch needs its tensors declared at `model add` "
                                    "(--input-name/--input-type/--input-size), engine triton as before", base)
    samples = make_samples(source.specs, source.bounds)
    reference, names = _reference(source, samples, output_names)
    signature = {"inputs": [s.as_signature() for s in source.specs], "outputs": output_specs(names, reference)}
    if runtime == "torch":
        return _torch(source, signature, "--runtime torch", base)
    onnx_path = workdir / "model.onnx"
    started = time.perf_counter()
    try:
        warned = export_onnx(source.model, source.specs, samples[0], names,
                             _output_axes(names, reference, source), onnx_path)
        agreement = check_agreement(onnx_path, source.specs, samples, reference, names)
    except ExportFailed as exc:
        return _fallback(source, signature, f"the ONNX export failed: {exc}", runtime, base)
    agreement.tracer_warnings = warned
    figures = {**base, "agreement": agreement.as_metadata(), "export_s": round(time.perf_counter() - started, 3)}
    if not agreement.agrees:
        why = agreement.problem + (f"; tracing warned: {warned[0]}" if warned else "")
        return _fallback(source, signature, f"the ONNX export disagrees with torch: {why}", runtime, figures)
    reason = (f"exported to ONNX; onnxruntime agrees with torch on batch sizes "
              f"{', '.join(map(str, sorted(set(agreement.batch_sizes))))} (max |diff| {agreement.max_abs_diff:.2g}, "
              f"tolerance {TOLERANCE})")
    return Prepared("onnx", onnx_path, None, "onnx", reason,
                    {"pytorch": {**figures, "runtime": "onnx", "reason": reason}})


def _fallback(source: Source, signature: dict, reason: str, runtime: str, meta: dict[str, Any]) -> Prepared:
    if runtime == "onnx":
        raise RuntimeChoiceError(f"--runtime onnx: {reason}")
    return _torch(source, signature, reason, meta)


def _torch(source: Source, signature: dict | None, reason: str, meta: dict[str, Any]) -> Prepared:
    return Prepared(source.kind, source.path, signature, "torch", reason,
                    {"pytorch": {**meta, "runtime": "torch", "reason": reason}})


def _reference(source: Source, samples: list[list[Any]], output_names: Sequence[str]
               ) -> tuple[list[list[np.ndarray]], list[str]]:
    """torch's own outputs on every sample, and the outputs' names: ``--output-name``, a dict's keys,
    else ``output__0``, ``output__1``, ... (the names Triton's PyTorch backend takes)."""
    runs, keys = [], None
    for sample in samples:
        shapes = [list(t.shape) for t in sample]
        try:
            with torch.no_grad():
                out = source.model(*sample)
        except Exception as exc:  # the user's forward on inputs of the declared shapes
            first = (str(exc).strip().splitlines() or [""])[0]
            raise SpecError(f"the model fails on sample inputs of shapes {shapes} (from the input flags or the "
                            f"program): {type(exc).__name__}: {first}") from None
        tensors = flatten(out)
        if not tensors or not all(isinstance(t, torch.Tensor) for t in tensors):
            raise SpecError("forward() must return tensors (a tensor, a tuple or list of them, or a dict of them)")
        keys = keys or output_keys(out)
        runs.append([to_numpy(t) for t in tensors])
    count = len(runs[0])
    names = list(output_names) or keys or [f"output__{i}" for i in range(count)]
    if len(names) != count:
        raise SpecError(f"--output-name gives {len(names)} name(s); the model returns {count} output(s)")
    return runs, names


def _output_axes(names: Sequence[str], runs: list[list[np.ndarray]], source: Source) -> dict[str, dict[int, str]]:
    """The outputs' dynamic dimensions for the exporter: named after the input dimension whose sizes
    they follow (``batch``), else their own."""
    sizes = sample_sizes(source.specs or [], source.bounds)
    symbols = {s: [per[s] for per in sizes] for s in (sizes[0] if sizes else {})}
    axes: dict[str, dict[int, str]] = {}
    for i, name in enumerate(names):
        for j in range(runs[0][i].ndim):
            seen = [run[i].shape[j] for run in runs]
            if len(set(seen)) > 1:
                axes.setdefault(name, {})[j] = next((s for s, v in symbols.items() if v == seen), f"{name}_{j}")
    return axes

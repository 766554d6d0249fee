"""A PyTorch model's inputs (names, dtypes, shapes with their dynamic dimensions), the sample tensors
the export and the agreement check run on, and the version's signature in Triton's dtype names.

Where the inputs come from: a ``.pt2`` carries them (its placeholders' shapes, symbolic where the
program was exported with dynamic dimensions, and its example inputs); TorchScript and state dicts do
not, so ``serving model upload`` takes them from ``--input-name/--input-type/--input-size``, the flags
``serving model add`` takes from ClearML. ``--input-size`` gives one example's dims without the batch
dimension (Triton's dims, ClearML's ``--input-size 1 28 28``), -1 for a dimension of any size; the
platform puts a dynamic batch dimension in front.

Samples: ``len(BATCHES)`` sets of tensors, one batch size each (the first is the one the export
traces with), every other dynamic dimension a different size in each. Floats are standard normal,
integers uniform in ``[low, high)`` (``INT_RANGE`` unless a program's example inputs say otherwise,
so token ids stay inside a small vocabulary), from a fixed seed: the same upload checks the same way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

BATCH = "batch"
BATCHES = (2, 1, 5)  # batch sizes of the samples; the export traces with the first
OTHER_SIZES = (5, 3, 8)  # any other dynamic dimension, sample by sample
INT_RANGE = (0, 4)
SEED = 0

# torch dtype names -> Triton's (the worker's signatures use Triton's names: docs/architecture.md)
TORCH_TO_TRITON = {"torch.float32": "FP32", "torch.float64": "FP64", "torch.float16": "FP16", "torch.bfloat16": "FP32",
                   "torch.int64": "INT64", "torch.int32": "INT32", "torch.int16": "INT16", "torch.int8": "INT8",
                   "torch.uint8": "UINT8", "torch.bool": "BOOL"}
TRITON_TO_TORCH = {"FP32": "float32", "FP64": "float64", "FP16": "float16", "INT64": "int64", "INT32": "int32",
                   "INT16": "int16", "INT8": "int8", "UINT8": "uint8", "BOOL": "bool"}


class SpecError(ValueError):
    """The inputs cannot be described or sampled (a message for the user)."""


@dataclass(frozen=True)
class InputSpec:
    name: str
    dtype: str  # Triton's name
    dims: tuple[int | str, ...]  # the whole shape; a str names a dynamic dimension (one name, one size)
    low: int = INT_RANGE[0]
    high: int = INT_RANGE[1]  # integers are drawn from [low, high)

    @property
    def shape(self) -> list[int]:
        return [-1 if isinstance(d, str) else int(d) for d in self.dims]

    def as_signature(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype, "shape": self.shape}


def specs_from_flags(names: Sequence[str], types: Sequence[str], sizes: Sequence[Sequence[int]]) -> list[InputSpec]:
    """One spec per name; a single type or size applies to every input (as ClearML's flags do)."""
    from registry.io_spec import IOMismatch, triton_dtype

    types = list(types) * len(names) if len(types) == 1 else list(types)
    sizes = list(sizes) * len(names) if len(sizes) == 1 else list(sizes)
    for flag, values in (("--input-type", types), ("--input-size", sizes)):
        if values and len(values) != len(names):
            raise SpecError(f"{flag} has {len(values)} value(s) for {len(names)} input(s) {list(names)}")
    if not sizes:
        raise SpecError("give the inputs' sizes with --input-size (one example's dims, without the batch dimension)")
    specs = []
    for i, name in enumerate(names):
        try:
            dtype = triton_dtype(types[i]) if types else "FP32"
        except IOMismatch as exc:
            raise SpecError(f"--input-type for {name!r}: {exc}") from None
        if dtype not in TRITON_TO_TORCH:
            raise SpecError(f"--input-type for {name!r}: {dtype} is not a tensor dtype torch takes here")
        if any(d == 0 or d < -1 for d in sizes[i]):
            raise SpecError(f"--input-size for {name!r}: {list(sizes[i])}: dims are positive, or -1 for any size")
        dims = tuple(f"{name}_{j + 1}" if d == -1 else int(d) for j, d in enumerate(sizes[i]))
        specs.append(InputSpec(name, dtype, (BATCH, *dims)))
    return specs


def specs_from_program(program: Any) -> tuple[list[InputSpec], dict[str, tuple[int, int | None]]]:
    """A ``.pt2``'s inputs (its placeholders, in call order) and the bounds of its dynamic dimensions."""
    import torch

    args, kwargs = _examples(program)
    if kwargs or not all(isinstance(a, torch.Tensor) for a in args):
        raise SpecError("the exported program takes keyword or non-tensor inputs; the platform calls it with "
                        "positional tensors (export a forward(self, *tensors))")
    users = list(program.graph_signature.user_inputs)
    nodes = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    specs = []
    for i, name in enumerate(users):
        val = nodes[name].meta.get("val")
        if val is None or str(val.dtype) not in TORCH_TO_TRITON:
            raise SpecError(f"input {name!r} of the exported program is not a tensor of a dtype served here")
        dims = tuple(_dim(name, d) for d in val.shape)
        low, high = _int_range(args[i] if i < len(args) else None)
        specs.append(InputSpec(name, TORCH_TO_TRITON[str(val.dtype)], dims, low, high))
    return specs, _bounds(program)


def _examples(program: Any) -> tuple[tuple, dict]:
    examples = getattr(program, "example_inputs", None)
    if not examples:
        return (), {}
    args, kwargs = examples
    return tuple(args), dict(kwargs or {})


def _dim(name: str, d: Any) -> int | str:
    if isinstance(d, int):
        return d
    text = str(d)
    if not text.isidentifier():  # an expression such as 2*s0: no size of its own to give
        raise SpecError(f"input {name!r} has a dimension {text}; the platform samples plain dynamic dimensions only")
    return text


def _int_range(example: Any) -> tuple[int, int]:
    if example is None or example.dtype.is_floating_point or example.numel() == 0 or str(example.dtype) == "torch.bool":
        return INT_RANGE
    return int(example.min()), int(example.max()) + 1


def _bounds(program: Any) -> dict[str, tuple[int, int | None]]:
    bounds = {}
    for symbol, vr in (getattr(program, "range_constraints", None) or {}).items():
        try:
            upper: int | None = int(vr.upper)
        except (TypeError, AttributeError, ValueError, OverflowError):  # int_oo: no upper bound
            upper = None
        bounds[str(symbol)] = (int(vr.lower), upper)
    return bounds


def sample_sizes(specs: Sequence[InputSpec], bounds: dict[str, tuple[int, int | None]] | None = None
                 ) -> list[dict[str, int]]:
    """Each sample's size for every dynamic dimension, inside its bounds: a dimension that comes
    first in some input is a batch dimension (BATCHES), any other OTHER_SIZES."""
    bounds = bounds or {}
    symbols = {d: any(s.dims and s.dims[0] == d for s in specs) for s in specs for d in s.dims if isinstance(d, str)}
    sizes = []
    for k in range(len(BATCHES)):
        chosen = {}
        for symbol, is_batch in symbols.items():
            low, high = bounds.get(symbol, (1, None))
            value = max(BATCHES[k] if is_batch else OTHER_SIZES[k], low, 1)
            chosen[symbol] = min(value, high) if high is not None else value
        sizes.append(chosen)
    return sizes


def make_samples(specs: Sequence[InputSpec], bounds: dict[str, tuple[int, int | None]] | None = None
                 ) -> list[list[Any]]:
    """Per sample, the tensors in input order."""
    import torch

    generator = torch.Generator().manual_seed(SEED)
    samples = []
    for sizes in sample_sizes(specs, bounds):
        tensors = []
        for spec in specs:
            shape = [sizes[d] if isinstance(d, str) else d for d in spec.dims]
            dtype = getattr(torch, TRITON_TO_TORCH[spec.dtype])
            if spec.dtype == "BOOL":
                tensors.append(torch.randint(0, 2, shape, generator=generator).bool())
            elif dtype.is_floating_point:
                tensors.append(torch.randn(shape, generator=generator).to(dtype))
            else:
                tensors.append(torch.randint(spec.low, max(spec.high, spec.low + 1), shape, generator=generator,
                                             dtype=dtype))
        samples.append(tensors)
    return samples


def to_numpy(tensor: Any) -> np.ndarray:
    """A torch output as numpy (bfloat16, which numpy lacks, as float32)."""
    import torch

    t = tensor.detach().cpu()
    return (t.float() if t.dtype == torch.bfloat16 else t).numpy()


def output_specs(names: Sequence[str], runs: Sequence[Sequence[np.ndarray]]) -> list[dict[str, Any]]:
    """Outputs' signature: a dimension whose size differs between samples is dynamic (-1)."""
    specs = []
    for i, name in enumerate(names):
        arrays = [run[i] for run in runs]
        shapes = {a.shape for a in arrays}
        rank = len(arrays[0].shape)
        if any(len(s) != rank for s in shapes):
            raise SpecError(f"output {name!r} changes rank from one batch size to another: {sorted(shapes)}")
        shape = [arrays[0].shape[j] if len({s[j] for s in shapes}) == 1 else -1 for j in range(rank)]
        dtype = _numpy_to_triton(arrays[0].dtype)
        specs.append({"name": name, "dtype": dtype, "shape": shape})
    return specs


def _numpy_to_triton(dtype: np.dtype) -> str:
    for triton, torch_name in TRITON_TO_TORCH.items():
        if np.dtype(torch_name) == dtype:
            return triton
    raise SpecError(f"an output of dtype {dtype} has no Triton equivalent")

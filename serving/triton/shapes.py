"""Which models Triton may batch, and the shapes a batched model's tensors travel in.

Batching concatenates requests along the first dimension and splits every output back along it,
so it is only right for a model whose every input and output starts with a free batch dimension.
A model with a scalar output (a count, a loss) or a fixed first dimension would be run on several
requests at once and its answer split wrongly, or not at all: such a model is served unbatched
whatever the endpoint's ``max_batch_size`` says.

Triton needs non-empty ``dims`` after it strips the batch dimension, so a batched tensor of shape
``[batch]`` (a string per row, a label per row) is declared ``dims: [1]`` with ``reshape: []``, as
Triton's documentation prescribes: the model sees ``[batch]`` and the API speaks ``[batch, 1]``.
The worker's Triton engine adds and drops that trailing 1 (``to_api`` / ``from_api``) so a client
sees the model's own shapes on every engine.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np


def _tensors(signature: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    return [*((signature or {}).get("inputs") or []), *((signature or {}).get("outputs") or [])]


def batchable(signature: Mapping[str, Any] | None) -> bool:
    """Every tensor has a free first dimension. Without a signature Triton decides (auto-complete)."""
    tensors = _tensors(signature)
    return all(len(t.get("shape") or []) >= 1 and int(t["shape"][0]) < 0 for t in tensors)


def batch_size(batching: Mapping[str, Any] | None, signature: Mapping[str, Any] | None) -> int:
    """The ``max_batch_size`` a model is really served with: the endpoint's, or 0 when batching
    would split its answers wrongly. A model that came with its config.pbtxt (its signature carries
    that ``max_batch_size``) keeps it, batched or not, and the endpoint's may only make it smaller."""
    wanted = int((batching or {}).get("max_batch_size") or 0)
    fixed = (signature or {}).get("max_batch_size")
    if fixed is not None:  # the model's own config.pbtxt: its dims mean what its max_batch_size says
        fixed = int(fixed)
        return min(wanted, fixed) if wanted > 0 and fixed > 0 else fixed
    return wanted if wanted > 0 and batchable(signature) else 0


def config_dims(shape: list[int], batched: bool) -> tuple[list[int], list[int] | None]:
    """(dims, reshape) for a config.pbtxt tensor. Batched ``[batch]`` is ``dims: [1]`` reshaped to
    ``[]``; an unbatched scalar is ``dims: [1]`` alone, since Triton refuses an empty reshape
    without batching ("scalar tensors are not supported")."""
    dims = list(shape[1:] if batched else shape)
    return (dims, None) if dims else ([1], [] if batched else None)


def padded(specs: Iterable[Mapping[str, Any]], batched: bool) -> dict[str, int]:
    """The tensors that travel with a trailing dimension of 1 over Triton's API, with the model's
    own rank for each."""
    rank = 1 if batched else 0
    return {s["name"]: rank for s in specs if len(s.get("shape") or []) == rank}


def to_api(inputs: Mapping[str, np.ndarray], ranks: Mapping[str, int]) -> dict[str, np.ndarray]:
    return {n: a[..., np.newaxis] if a.ndim == ranks.get(n, -1) else a for n, a in inputs.items()}


def from_api(outputs: Mapping[str, np.ndarray], ranks: Mapping[str, int]) -> dict[str, np.ndarray]:
    """Drops the trailing 1 of Triton's API shape; an output already in the model's own rank (the
    Python backend answers what onnxruntime computed) is left as it is."""
    return {n: a.reshape(a.shape[:-1]) if a.ndim == ranks.get(n, -2) + 1 and a.shape[-1] == 1 else a
            for n, a in outputs.items()}

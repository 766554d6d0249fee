"""Continuous batching in the worker, in front of Triton.

Triton's dynamic batcher only batches requests of one shape and closes a batch at
the first queued request of another, so tokenized texts of mixed lengths reach the
model one by one, and every execution pays Triton's per-call cost (the W1 benchmark
measured 1.1 requests an execution). The worker knows what Triton does not: which
inputs are token sequences and what pads them. So while a call for a model is in
flight, the model's next requests wait here; when a call slot frees, all that
waited go as one request, padded to the longest (the attention mask hides the
padding, so each row's result is what it would be alone). With no call in flight a
request goes at once: batching adds no delay at low load.

Inputs of different lengths are only merged when the caller gives pad values for
every input, the model takes an ``attention_mask``, and every model output has a
fixed size past the batch dimension (a classifier's logits); otherwise only
requests of identical shapes are merged.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Sequence

import numpy as np

Tensors = dict[str, np.ndarray]
MASK = "attention_mask"
Send = Callable[[Tensors], Awaitable[Tensors]]


@dataclass
class _Item:
    inputs: Tensors
    future: asyncio.Future
    pad: Mapping[str, int] | None
    rows: int = field(init=False)

    def __post_init__(self) -> None:
        self.rows = int(next(iter(self.inputs.values())).shape[0])

    def shapes(self) -> tuple:
        return tuple((name, array.shape) for name, array in self.inputs.items())


def can_pad(item: _Item, outputs: Sequence[dict]) -> bool:
    """Whether a request may share a call with others of different lengths: 2-D inputs, each with
    a pad value, and outputs whose size does not depend on the sequence length."""
    if not item.pad or not outputs or MASK not in item.inputs:  # padding is invisible only behind a mask
        return False
    if any(name not in item.pad or array.ndim != 2 for name, array in item.inputs.items()):
        return False
    return all(all(int(d) >= 0 for d in (o.get("shape") or [-1])[1:]) for o in outputs)


def merge(items: Sequence[_Item], pad: Mapping[str, int] | None) -> Tensors:
    """One request from several: concatenated on the batch axis, padded on the sequence axis."""
    merged: Tensors = {}
    for name in items[0].inputs:
        arrays = [item.inputs[name] for item in items]
        width = max(a.shape[1] for a in arrays) if arrays[0].ndim == 2 else None
        if pad is not None and width is not None and any(a.shape[1] != width for a in arrays):
            arrays = [np.pad(a, ((0, 0), (0, width - a.shape[1])), constant_values=pad[name]) for a in arrays]
        merged[name] = np.concatenate(arrays, axis=0)
    return merged


def split(outputs: Tensors, items: Sequence[_Item]) -> list[Tensors]:
    """Each request's rows of every output, in order."""
    bounds = np.cumsum([0, *(item.rows for item in items)])
    return [{name: array[bounds[i]:bounds[i + 1]] for name, array in outputs.items()} for i in range(len(items))]


class MicroBatcher:
    """Requests for one model: at most ``max_in_flight`` calls at a time, each carrying up to
    ``max_rows`` rows of whatever queued meanwhile."""

    def __init__(self, send: Send, max_rows: int, outputs: Sequence[dict], max_in_flight: int = 2) -> None:
        self.send = send
        self.max_rows = max(1, max_rows)
        self.outputs = outputs
        self.max_in_flight = max_in_flight
        self._queue: list[_Item] = []
        self._in_flight = 0

    async def submit(self, inputs: Tensors, pad: Mapping[str, int] | None = None) -> Tensors:
        """``pad``: a pad value per input, where the inputs are token sequences that may be padded."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append(_Item(inputs, future, pad))
        self._pump()
        return await future

    def _pump(self) -> None:
        while self._queue and self._in_flight < self.max_in_flight:
            batch, padded = self._take()
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._call(batch, batch[0].pad if padded else None))

    def _take(self) -> tuple[list[_Item], bool]:
        """The head of the queue and every later request that fits with it (rows, shapes), and
        whether they are merged by padding."""
        head = self._queue[0]
        padded = can_pad(head, self.outputs)
        batch, rest, rows = [head], [], head.rows
        for item in self._queue[1:]:
            if padded:
                fits = item.pad == head.pad and item.inputs.keys() == head.inputs.keys() and can_pad(item, self.outputs)
            else:
                fits = item.shapes() == head.shapes()
            if fits and rows + item.rows <= self.max_rows:
                batch.append(item)
                rows += item.rows
            else:
                rest.append(item)
        self._queue = rest
        return batch, padded

    async def _call(self, batch: list[_Item], pad: Mapping[str, int] | None) -> None:
        try:
            merged = batch[0].inputs if len(batch) == 1 else merge(batch, pad)
            results = split(await self.send(merged), batch)
        except BaseException as exc:  # every waiting request gets the call's error
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for item, result in zip(batch, results):
                if not item.future.done():  # the client may have gone away
                    item.future.set_result(result)
        finally:
            self._in_flight -= 1
            self._pump()

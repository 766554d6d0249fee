"""Batching by tokens for encoder endpoints: the texts of every request waiting for one model version,
grouped by length into engine calls under a token budget, and each request's rows joined back in order.

Why by tokens and not by requests: an encoder's cost is its padded tokens (rows x the longest row),
so what bounds a call is ``max_batch_tokens`` (TEI's ``--max-batch-tokens``, default 16,384), and
what wastes one is padding. A request of 256 texts is 256 rows like any other: it is cut into calls
under the budget, runs on every free slot at once, and comes back as one answer; single-text
requests arriving together share calls.

How a call is formed (:func:`take`): the oldest waiting row always goes (nothing waits forever), with
the waiting rows of its length group, oldest first, while the call stays within the budget and the row
cap (the engine's batch size: Triton's ``max_batch_size``). Length groups (:func:`groups`) cut the
waiting rows' lengths where the padding a wider call computes would cost more than another call: a
call costs a fixed share plus its padded tokens (rows x the longest), and the fixed share, in tokens,
is fitted on this batcher's own calls (serving/embeddings/call_cost.py). On a CPU a padded position costs
what a real one does, so with many rows waiting each call holds rows of one or two lengths (a 1.25x
padding ratio let 32-row calls of 32 clients x 8 requests pad 12%: 5.2 CPU ms a sentence in
onnxruntime against 4.7 unpadded), and with few waiting rows of mixed lengths they still share a call
where a call of their own would cost more. Waiting rows are shared out over the free call slots by
tokens (each call takes at most its slot's share of the waiting rows' real tokens), so a lone big
request keeps every slot busy and the calls end together: shared out by rows, a call of the short rows
ended long before the call of the long ones, and its core idled while the request waited for the
other (MiniLM, 32 sentences a request, one client: each onnxruntime thread idle about a third of the
time). With nothing waiting a request goes at once: no delay at low load.

The caller's ``send`` runs one call and returns a fixed-size result per row (the encoder's
``reduce``: pooled vectors or scores), which is what lets rows of different requests and lengths
share a call and be split again.
"""
from __future__ import annotations

import asyncio
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Mapping, Sequence

import numpy as np

from serving.embeddings.call_cost import DEFAULT_TOKENS, CallCost

Tensors = dict[str, np.ndarray]
Send = Callable[[Tensors, np.ndarray], Awaitable[Tensors]]  # (inputs, row lengths) -> a result per row
MAX_SPAN = 64  # distinct lengths one group may hold: bounds the cost of forming a call at O(lengths x 64)


@dataclass
class _Request:
    inputs: Tensors
    lengths: np.ndarray
    pad: Mapping[str, int]
    future: asyncio.Future
    led: list[int]  # sizes of the calls this request's row headed (its statistics)
    results: Tensors = field(default_factory=dict)
    left: int = 0

    def __post_init__(self) -> None:
        self.left = len(self.lengths)


@dataclass(frozen=True)
class _Row:
    request: _Request
    index: int
    length: int


def _per_call(width: int, waiting: int, max_tokens: int, max_rows: int | None) -> int:
    """Rows of ``width`` tokens one call may hold: the row cap and the budget (a row over it goes alone)."""
    return max(1, min(max_rows or waiting, max_tokens // width))


def groups(lengths: Sequence[int], max_tokens: int, max_rows: int | None,
           call_tokens: float = DEFAULT_TOKENS) -> list[tuple[int, int]]:
    """The waiting rows' lengths cut into ranges (shortest, longest) at the least cost, a range's rows
    making one call or more, each costing ``call_tokens`` plus its padded tokens (rows x the range's
    longest). Least cost by dynamic programming over the distinct lengths; a range never reaches rows
    more than ``call_tokens`` shorter than its longest (each would pad more than a call costs), nor
    more than ``MAX_SPAN`` distinct lengths (a GPU's costly calls would otherwise make the search
    quadratic in the lengths waiting)."""
    counts = Counter(lengths)
    values = sorted(counts)
    best = [0.0] * (len(values) + 1)
    start = [0] * (len(values) + 1)
    for j, width in enumerate(values, 1):
        per_call = _per_call(width, len(lengths), max_tokens, max_rows)
        rows, best[j] = 0, math.inf
        for i in range(j, 0, -1):
            if i < j and (width - values[i - 1] > call_tokens or j - i >= MAX_SPAN):
                break
            rows += counts[values[i - 1]]
            cost = best[i - 1] + math.ceil(rows / per_call) * call_tokens + rows * width
            if cost < best[j]:
                best[j], start[j] = cost, i - 1
    cuts, j = [], len(values)
    while j:
        cuts.append((values[start[j]], values[j - 1]))
        j = start[j]
    return cuts[::-1]


def take(lengths: Sequence[int], max_tokens: int, max_rows: int | None, call_tokens: float = DEFAULT_TOKENS,
         share: int | None = None) -> list[int]:
    """Which waiting rows (indices into ``lengths``, oldest first) make the next call: the oldest, then
    the oldest others of its length group (:func:`groups`) that keep the call within the budget (padded
    tokens), the row cap and ``share`` (real tokens)."""
    lo, hi = next(g for g in groups(lengths, max_tokens, max_rows, call_tokens) if g[0] <= lengths[0] <= g[1])
    cap = _per_call(hi, len(lengths), max_tokens, max_rows)
    chosen, real = [0], lengths[0]
    for i in range(1, len(lengths)):
        if len(chosen) >= cap:
            break
        n = lengths[i]
        if lo <= n <= hi and (share is None or real + n <= share):
            chosen.append(i)
            real += n
    return chosen


class TokenBatcher:
    """The rows waiting for one model version; at most ``max_in_flight`` calls at a time."""

    def __init__(self, send: Send, max_tokens: int, max_rows: int | None, max_in_flight: int) -> None:
        self.send = send
        self.max_tokens = max(1, int(max_tokens))
        self.max_rows = max_rows if max_rows and max_rows > 0 else None
        self.max_in_flight = max(1, int(max_in_flight))
        self._waiting: list[_Row] = []
        self._in_flight = 0
        self.cost = CallCost()  # what one more call costs, in padded tokens, fitted on this batcher's calls

    async def submit(self, inputs: Tensors, lengths: np.ndarray, pad: Mapping[str, int],
                     led: list[int] | None = None) -> Tensors:
        """Each row's result, in the request's order. ``inputs``: right-padded rows of token tensors;
        ``pad``: the value each input is padded with; ``led``: gets the sizes of the calls this
        request's rows headed."""
        future = asyncio.get_running_loop().create_future()
        request = _Request(inputs, np.asarray(lengths), pad, future, led if led is not None else [])
        self._waiting.extend(_Row(request, i, max(1, int(n))) for i, n in enumerate(request.lengths))
        self._pump()
        return await future

    def _pump(self) -> None:
        free = self.max_in_flight - self._in_flight
        if not self._waiting or free <= 0:
            return
        # one share for every slot free now: a call its length group keeps small leaves its tokens waiting
        # for the next free slot, not to the last call formed now
        share = math.ceil(sum(r.length for r in self._waiting) / free)
        while self._waiting and self._in_flight < self.max_in_flight:
            lengths = [r.length for r in self._waiting]
            picked = take(lengths, self.max_tokens, self.max_rows, self.cost.tokens, share=share)
            keep = set(picked)
            rows = [self._waiting[i] for i in picked]
            self._waiting = [r for i, r in enumerate(self._waiting) if i not in keep]
            rows[0].request.led.append(len(rows))
            self._in_flight += 1
            asyncio.get_running_loop().create_task(self._call(rows))

    async def _call(self, rows: list[_Row]) -> None:
        try:
            inputs, lengths = _merge(rows)
            started = time.perf_counter()
            results = await self.send(inputs, lengths)
            self.cost.observe(len(rows) * int(lengths.max()), time.perf_counter() - started)
        except BaseException as exc:  # every request with a row in the call gets its error
            for request in {id(r.request): r.request for r in rows}.values():
                if not request.future.done():
                    request.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            _scatter(rows, results)
        finally:
            self._in_flight -= 1
            self._pump()


def _merge(rows: list[_Row]) -> tuple[Tensors, np.ndarray]:
    """One call's tensors: the rows padded to the longest of them (a whole request in its own order
    and width goes as it is)."""
    first = rows[0].request
    lengths = np.array([r.length for r in rows])
    width = int(lengths.max())
    whole = (all(r.request is first for r in rows) and len(rows) == len(first.lengths)
             and all(r.index == i for i, r in enumerate(rows)))
    if whole and next(iter(first.inputs.values())).shape[1] == width:
        return first.inputs, lengths
    merged: Tensors = {}
    for name, array in first.inputs.items():
        out = np.full((len(rows), width), first.pad.get(name, 0), dtype=array.dtype)
        for j, row in enumerate(rows):
            source = row.request.inputs[name]
            n = min(width, source.shape[1])
            out[j, :n] = source[row.index, :n]
        merged[name] = out
    return merged, lengths


def _scatter(rows: list[_Row], results: Tensors) -> None:
    for j, row in enumerate(rows):
        request = row.request
        if request.future.done():  # failed in another call, or its client went away
            continue
        for name, values in results.items():
            if name not in request.results:
                request.results[name] = np.empty((len(request.lengths), *values.shape[1:]), dtype=values.dtype)
            request.results[name][row.index] = values[j]
        request.left -= 1
        if request.left == 0:
            request.future.set_result(request.results)

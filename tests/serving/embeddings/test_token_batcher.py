"""The token batcher on its own: which rows make a call, a 256-row request cut under the budget and
joined back in order, rows of concurrent requests sharing calls, a failed call's requests failing.
``send`` here answers each row with numbers computed from its own tokens, so a row joined back in
the wrong place, or padded into another row's values, shows."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving.embeddings.token_batcher import TokenBatcher, groups, take

PAD = {"input_ids": 0, "attention_mask": 0}


def test_take_keeps_the_oldest_and_its_length_group_within_budget_and_cap():
    assert take([10], 100, None) == [0]
    assert take([10, 50, 11, 9, 10], 1000, None) == [0, 2, 3, 4]  # 50 pads more than a call of its own costs
    assert take([10, 10, 10, 10], 30, None) == [0, 1, 2]  # 4 x 10 is over the budget of 30
    assert take([10, 10, 10, 10], 1000, 2) == [0, 1]  # the row cap
    assert take([600, 10], 512, None) == [0]  # a row longer than the budget still goes, alone
    assert take([40, 32, 33, 41, 40], 1000, None) == [0, 3, 4]  # 32 and 33 make their own call
    assert take([12, 11, 30, 10, 12], 1000, None, share=30) == [0, 1]  # a third row would pass the slot's share


def test_groups_weigh_padding_against_the_cost_of_one_more_call():
    """A call costs ``call_tokens`` plus its padded tokens: few rows of near lengths share a call, many
    rows of each length do not pad to share one, and a costlier call (a GPU's) pads further."""
    assert groups([20, 21, 23], 100000, None, call_tokens=8) == [(20, 23)]  # 77 padded+call against 81 split
    assert groups([20] * 30 + [21] * 30, 100000, 32, call_tokens=8) == [(20, 20), (21, 21)]  # 30 padded > 8
    assert groups([5] * 16 + [40] * 16, 100000, None, call_tokens=8) == [(5, 5), (40, 40)]
    assert groups([5, 40], 100000, None, call_tokens=8) == [(5, 5), (40, 40)]
    assert groups([5, 40], 100000, None, call_tokens=100) == [(5, 40)]  # 180 together against 245 apart
    # lengths 1 to 100 once each, calls of 4096 tokens: one call (14,096) beats any two (15,692 for halves),
    # but a group holds at most 64 distinct lengths, which bounds the search
    cuts = groups(list(range(1, 101)), 10**6, None, 4096)
    assert len(cuts) == 2 and all(hi - lo + 1 <= 64 for lo, hi in cuts), cuts


def test_many_waiting_rows_of_spread_lengths_make_calls_that_pad_little():
    """32 clients x 8 requests of 32 sentences leave about 200 rows of lengths 10 to 40 waiting. Calls of
    the 32 rows closest to the oldest's length, within 1.25 computed tokens a real one, padded 12%
    (5.2 CPU ms a sentence in onnxruntime against 4.7 unpadded); the length groups pad under 5%."""
    lengths = [int(n) for n in np.random.default_rng(5).integers(10, 41, size=200)]
    waiting, padded, real = list(lengths), 0, 0
    while waiting:
        picked = take(waiting, 16384, 32)
        rows = [waiting[i] for i in picked]
        padded, real = padded + len(rows) * max(rows), real + sum(rows)
        waiting = [n for i, n in enumerate(waiting) if i not in set(picked)]
    assert padded / real < 1.05, padded / real


def _request(lengths: list[int], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    width = max(lengths)
    ids = np.zeros((len(lengths), width), dtype=np.int64)
    for i, n in enumerate(lengths):
        ids[i, :n] = rng.integers(1, 30000, size=n)
    return {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64)}


def _expected(inputs: dict[str, np.ndarray]) -> np.ndarray:
    ids = inputs["input_ids"].astype(np.float64)
    return np.stack([ids.sum(axis=1), (ids > 0).sum(axis=1)], axis=1)


class Engine:
    """Per row: the sum of its token ids and its real length; records each call's shape."""

    def __init__(self, delay: float = 0.0, fail_on: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.real: list[list[int]] = []  # each call's rows' real lengths
        self.delay, self.fail_on = delay, fail_on

    async def send(self, inputs: dict[str, np.ndarray], lengths: np.ndarray) -> dict[str, np.ndarray]:
        self.calls.append(inputs["input_ids"].shape)
        self.real.append([int(n) for n in lengths])
        await asyncio.sleep(self.delay)
        if self.fail_on is not None and len(self.calls) == self.fail_on:
            raise RuntimeError("engine failed")
        assert np.array_equal((inputs["attention_mask"] > 0).sum(axis=1), lengths)
        return {"out": _expected(inputs)}


def test_a_256_row_request_is_cut_under_the_budget_and_joined_in_order():
    lengths = list(np.random.default_rng(0).integers(3, 120, size=256))
    inputs = _request(lengths, 1)
    engine = Engine()

    async def main() -> tuple[dict, list[int]]:
        batcher = TokenBatcher(engine.send, max_tokens=2048, max_rows=32, max_in_flight=2)
        led: list[int] = []
        return await batcher.submit(inputs, np.array(lengths), PAD, led), led

    out, led = asyncio.run(main())
    np.testing.assert_array_equal(out["out"], _expected(inputs))
    assert len(engine.calls) > 8 and sum(rows for rows, _ in engine.calls) == 256
    assert all(rows * width <= 2048 and rows <= 32 for rows, width in engine.calls)
    assert sorted(led) == sorted(rows for rows, _ in engine.calls)  # it headed every call it was alone in


def test_concurrent_requests_share_calls_and_each_gets_its_own_rows():
    engine = Engine(delay=0.02)
    requests = [_request([int(n)], seed) for seed, n in enumerate(np.random.default_rng(2).integers(5, 9, size=12))]

    async def main() -> list[dict]:
        batcher = TokenBatcher(engine.send, max_tokens=16384, max_rows=None, max_in_flight=1)
        return await asyncio.gather(*(batcher.submit(r, r["attention_mask"].sum(axis=1), PAD) for r in requests))

    answers = asyncio.run(main())
    for request, answer in zip(requests, answers):
        np.testing.assert_array_equal(answer["out"], _expected(request))
    assert len(engine.calls) < len(requests)  # the first went alone, the rest queued behind it together


def test_a_failed_call_fails_the_requests_in_it_and_not_the_next():
    engine = Engine(delay=0.01, fail_on=1)

    async def main() -> tuple:
        batcher = TokenBatcher(engine.send, max_tokens=16384, max_rows=None, max_in_flight=1)
        first = _request([4, 6], 0)
        failed = await asyncio.gather(batcher.submit(first, np.array([4, 6]), PAD), return_exceptions=True)
        later = _request([5], 1)
        return failed, later, await batcher.submit(later, np.array([5]), PAD)

    failed, later, answer = asyncio.run(main())
    assert isinstance(failed[0], RuntimeError)
    np.testing.assert_array_equal(answer["out"], _expected(later))


@pytest.mark.parametrize("in_flight", [1, 3])
def test_free_slots_share_the_waiting_rows(in_flight):
    engine = Engine(delay=0.01)
    inputs = _request([10] * 90, 3)

    async def main() -> dict:
        batcher = TokenBatcher(engine.send, max_tokens=100000, max_rows=None, max_in_flight=in_flight)
        return await batcher.submit(inputs, np.full(90, 10), PAD)

    np.testing.assert_array_equal(asyncio.run(main())["out"], _expected(inputs))
    assert [rows for rows, _ in engine.calls] == [90 // in_flight] * in_flight


def test_free_slots_share_the_waiting_tokens_so_their_calls_end_together():
    """16 short rows first, then 16 long ones, on 2 slots: shared out by rows, one call took the 16 short
    rows (80 tokens) and the other the 16 long ones (640): the first slot idled while the request waited
    for the second. By tokens the long call takes
    half the tokens, 360, and the short call's slot takes the other 280 after its 80: each slot
    computes 360. (Short and long rows are in length groups of their own: 35 tokens of padding a row
    cost more than a call.)"""
    engine = Engine(delay=0.01)
    lengths = [5] * 16 + [40] * 16
    inputs = _request(lengths, 4)

    async def main() -> dict:
        batcher = TokenBatcher(engine.send, max_tokens=100000, max_rows=None, max_in_flight=2)
        return await batcher.submit(inputs, np.array(lengths), PAD)

    np.testing.assert_array_equal(asyncio.run(main())["out"], _expected(inputs))
    assert [sum(call) for call in engine.real] == [80, 360, 280], engine.real


def test_the_batcher_fits_its_call_cost_on_its_own_calls():
    engine = Engine()

    async def main() -> TokenBatcher:
        batcher = TokenBatcher(engine.send, max_tokens=64, max_rows=None, max_in_flight=1)
        lengths = [int(n) for n in np.random.default_rng(6).integers(3, 30, size=40)]
        await batcher.submit(_request(lengths, 7), np.array(lengths), PAD)
        return batcher

    batcher = asyncio.run(main())
    assert batcher.cost.seen == len(engine.calls) > 1

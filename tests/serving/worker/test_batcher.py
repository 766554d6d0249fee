"""The worker's continuous batching (serving/worker/batcher.py), in-process: a fake `send` stands
in for Triton so the test sees exactly what one call carries. Over a real Triton the same path is
checked by tests/serving/test_stack_e2e.py (logits equal to onnxruntime's)."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving.worker.batcher import MicroBatcher

PAD = {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}
LOGITS = ({"name": "logits", "dtype": "FP32", "shape": [-1, 2]},)
TOKENS = ({"name": "hidden", "dtype": "FP32", "shape": [-1, -1, 4]},)


def tokens(length: int, rows: int = 1, start: int = 100) -> dict[str, np.ndarray]:
    ids = np.arange(start, start + length, dtype=np.int64)[None, :].repeat(rows, axis=0)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


class FakeModel:
    """Answers each row with (sum of its unmasked ids, number of unmasked tokens): what a padded
    row would get wrong if the padding leaked through."""

    def __init__(self, delay: float = 0.02, fail: Exception | None = None) -> None:
        self.calls: list[dict[str, np.ndarray]] = []
        self.delay, self.fail = delay, fail

    async def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.calls.append(inputs)
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            raise self.fail
        mask = inputs["attention_mask"]
        return {"logits": np.stack([(inputs["input_ids"] * mask).sum(1), mask.sum(1)], axis=1).astype(np.float32)}


async def burst(batcher: MicroBatcher, requests: list[dict[str, np.ndarray]], pad=PAD) -> list[dict]:
    return await asyncio.gather(*(batcher.submit(r, pad) for r in requests))


def test_requests_of_different_lengths_share_calls_and_get_their_own_rows() -> None:
    model = FakeModel()
    batcher = MicroBatcher(model, max_rows=32, outputs=LOGITS, max_in_flight=1)
    requests = [tokens(n, start=10 * n) for n in (3, 9, 5, 9, 2, 7)]
    results = asyncio.run(burst(batcher, requests))
    # The first goes at once; the five that queued meanwhile go together, padded to 9.
    assert [c["input_ids"].shape for c in model.calls] == [(1, 3), (5, 9)]
    assert np.all(model.calls[1]["attention_mask"].sum(1) == [9, 5, 9, 2, 7])
    for request, result in zip(requests, results):
        ids = request["input_ids"][0]
        np.testing.assert_array_equal(result["logits"], [[ids.sum(), len(ids)]])


def test_multi_row_requests_keep_their_rows_and_max_rows_caps_a_call() -> None:
    model = FakeModel()
    batcher = MicroBatcher(model, max_rows=4, outputs=LOGITS, max_in_flight=1)
    requests = [tokens(4), tokens(6, rows=3), tokens(2, rows=2), tokens(5)]
    results = asyncio.run(burst(batcher, requests))
    assert [c["input_ids"].shape[0] for c in model.calls] == [1, 4, 2]  # 3 + 2 > 4: the 2-row one waits
    assert [r["logits"].shape[0] for r in results] == [1, 3, 2, 1]


def test_without_pad_values_or_with_sequence_outputs_only_equal_shapes_merge() -> None:
    for pad, outputs in ((None, LOGITS), (PAD, TOKENS)):
        model = FakeModel()
        batcher = MicroBatcher(model, max_rows=32, outputs=outputs, max_in_flight=1)
        asyncio.run(burst(batcher, [tokens(3), tokens(4), tokens(5), tokens(4), tokens(5)], pad=pad))
        assert [c["input_ids"].shape for c in model.calls] == [(1, 3), (2, 4), (2, 5)]


def test_a_model_without_a_mask_is_never_padded() -> None:
    model = FakeModel()
    batcher = MicroBatcher(lambda x: model({**x, "attention_mask": np.ones_like(x["input_ids"])}),
                           max_rows=32, outputs=LOGITS, max_in_flight=1)
    ids_only = [{"input_ids": tokens(n)["input_ids"]} for n in (3, 4, 5, 4)]
    asyncio.run(burst(batcher, ids_only))
    assert [c["input_ids"].shape for c in model.calls] == [(1, 3), (2, 4), (1, 5)]


def test_an_error_reaches_every_request_of_the_call_and_the_next_calls_still_run() -> None:
    model = FakeModel(fail=RuntimeError("triton down"))
    batcher = MicroBatcher(model, max_rows=32, outputs=LOGITS, max_in_flight=1)

    async def run() -> list:
        return await asyncio.gather(*(batcher.submit(tokens(n), PAD) for n in (3, 4, 5)), return_exceptions=True)

    results = asyncio.run(run())
    assert all(isinstance(r, RuntimeError) for r in results)
    model.fail = None
    assert asyncio.run(burst(batcher, [tokens(3)]))[0]["logits"].tolist() == [[sum(range(100, 103)), 3]]


@pytest.mark.parametrize("in_flight", [1, 2])
def test_at_most_max_in_flight_calls_at_a_time(in_flight: int) -> None:
    running, peak = 0, 0
    model = FakeModel()

    async def send(inputs):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        try:
            return await model(inputs)
        finally:
            running -= 1

    async def staggered() -> None:
        batcher = MicroBatcher(send, max_rows=2, outputs=LOGITS, max_in_flight=in_flight)
        await asyncio.gather(*(batcher.submit(tokens(3), PAD) for _ in range(9)))

    asyncio.run(staggered())
    assert peak == in_flight

"""The worker's processes sum their statistics over real abstract Unix sockets (stats_exchange.py):
two exchanges of one group answer each other's totals, a sibling that never answers is a 503 and
not a total that leaves it out, and another group's process is never counted."""
from __future__ import annotations

import asyncio
import os
import socket

import pytest

from serving.worker import stats_exchange
from serving.worker.errors import Unavailable
from serving.worker.stats_exchange import StatsExchange
from serving.worker.version_stats import VersionStatistics, merged, model_stats

GROUP = 4_000_000_000 + os.getpid()  # no real pid: no real worker's group


def counted(successes: int, failures: int, version: int = 1) -> VersionStatistics:
    stats = VersionStatistics()
    for status in [200] * successes + [400] * failures:
        stats.observe("clf", version, status, 0.002, {"preprocess": 0.0005, "inference": 0.001}, 1_700_000_000.5)
    return stats


def test_siblings_of_one_group_are_summed_and_other_groups_ignored():
    async def run() -> tuple[dict, dict]:
        one, two = counted(3, 1), counted(2, 0)
        two.observe("clf", 2, 200, 0.001, {}, 1_700_000_001.0)
        exchanges = [StatsExchange(s.rows, GROUP) for s in (one, two)]
        stranger = StatsExchange(counted(50, 50).rows, GROUP + 1)
        for e in (*exchanges, stranger):
            await e.start()
        try:
            totals = [merged(*(await e.gather())) for e in exchanges]
        finally:
            for e in (*exchanges, stranger):
                await e.stop()
        return tuple(model_stats(t, [("clf", 1), ("clf", 2)]) for t in totals)

    from_one, from_two = asyncio.run(run())
    assert from_one == from_two
    v1, v2 = from_one["model_stats"]
    assert v1["inference_stats"]["success"] == {"count": 5, "ns": 5 * 2_000_000}
    assert v1["inference_stats"]["fail"] == {"count": 1, "ns": 2_000_000}
    assert v1["inference_stats"]["compute_input"] == {"count": 5, "ns": 5 * 500_000}
    assert (v1["inference_count"], v1["execution_count"], v1["last_inference"]) == (5, 5, 1_700_000_000_500)
    assert (v2["inference_count"], v2["last_inference"]) == (1, 1_700_000_001_000)


def test_a_sibling_that_does_not_answer_is_a_503(monkeypatch):
    monkeypatch.setattr(stats_exchange, "TIMEOUT_S", 0.2)
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # listens, never accepts: a stuck process
    mute.bind(f"\0{stats_exchange.PREFIX}{GROUP}-1-mute")
    mute.listen(1)

    async def run() -> None:
        exchange = StatsExchange(counted(1, 0).rows, GROUP)
        await exchange.start()
        try:
            await exchange.gather()
        finally:
            await exchange.stop()

    try:
        with pytest.raises(Unavailable, match="did not report its statistics"):
            asyncio.run(run())
    finally:
        mute.close()


def test_without_a_manager_a_process_counts_alone():
    stats = counted(2, 1)
    exchange = StatsExchange(stats.rows, None)
    assert exchange.name is None
    assert asyncio.run(exchange.gather()) == [stats.rows()]

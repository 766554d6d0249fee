"""A worker's load on ``GET /metrics`` (serving/worker/load.py): the requests it holds now, counted from the
start of a request's life to its end, whatever the outcome, and summed over the worker's processes."""
from __future__ import annotations

import asyncio
import os

import httpx
from prometheus_client.parser import text_string_to_metric_families

from serving.load_metrics import IN_FLIGHT, PROCESSES
from serving.worker.load import InFlight, metrics_text
from serving.worker.stats_exchange import StatsExchange
from tests.serving.worker.test_clearml_runtime import SLOW, user_file

GROUP = 4_100_000_000 + os.getpid()  # no real pid: no real worker's group


def read(text: str | bytes) -> dict[str, float]:
    text = text.decode() if isinstance(text, bytes) else text
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_requests_are_counted_while_they_run_and_not_after_they_end_or_fail(make_client, store, tmp_path):
    sha = user_file(store, tmp_path, "slow.py", SLOW)
    slow = {"name": "slow", "engine": "custom", "targets": [], "metrics": [], "log_freq": 1.0, "batching": {},
            "preprocess": {"kind": "user", "artifact": sha, "options": {"timeout_s": 1.0}}}
    client, _ = make_client(slow)
    assert read(client.get("/metrics").text) == {IN_FLIGHT: 0.0, PROCESSES: 1.0}

    async def burst() -> tuple[list[float], list[int]]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w", timeout=30) as c:
            # 4 answered after 0.6 s, 2 past their 1 s deadline (504), 1 refused (bad JSON: 400, never started)
            calls = [asyncio.create_task(c.post("/serve/slow", json={"sleep": 0.6})) for _ in range(4)]
            calls += [asyncio.create_task(c.post("/serve/slow", json={"sleep": 3})) for _ in range(2)]
            calls.append(asyncio.create_task(c.post("/serve/slow", content=b"{not json",
                                                    headers={"content-type": "application/json"})))
            seen = []
            for _ in range(30):
                seen.append(read((await c.get("/metrics")).text)[IN_FLIGHT])
                if seen[-1] == 6:
                    break
                await asyncio.sleep(0.05)
            statuses = [r.status_code for r in await asyncio.gather(*calls)]
            return seen, statuses

    seen, statuses = asyncio.run(burst())
    assert sorted(statuses) == [200] * 4 + [400] + [504] * 2, statuses
    assert seen[-1] == 6, seen  # every started request at once; the refused one never counted
    assert read(client.get("/metrics").text)[IN_FLIGHT] == 0.0


def test_the_processes_of_one_worker_are_summed():
    async def run() -> list[tuple[int, int]]:
        loads = [InFlight(3), InFlight(2), InFlight(7)]
        exchanges = [StatsExchange(lambda load=load: {"versions": [], "in_flight": load.value}, GROUP)
                     for load in loads[:2]]
        stranger = StatsExchange(lambda: {"versions": [], "in_flight": loads[2].value}, GROUP + 1)
        for load, exchange in zip(loads, [*exchanges, stranger]):
            load.exchange = exchange
            await exchange.start()
        try:
            loads[1].begin()
            totals = [await load.worker_total() for load in loads]
            text = await metrics_text(loads[0])
        finally:
            for exchange in (*exchanges, stranger):
                await exchange.stop()
        assert read(text) == {IN_FLIGHT: 6.0, PROCESSES: 2.0}
        return totals

    assert asyncio.run(run()) == [(6, 2), (6, 2), (7, 1)]

"""The worker-side recorder: never blocks or raises, samples custom variables, counts what it drops.

Logic tests use an in-memory sender (the transport is a two-method protocol);
failure and loss accounting use the real HTTP transport and the real service.
"""
from __future__ import annotations

import itertools
import threading
import time

import httpx
import pytest

from serving.statistics.events import decode_batch
from serving.statistics.recorder import RecorderConfig, StatisticsRecorder
from serving.statistics.transports import SendError
from serving.statistics.transports.embedded import HttpSender
from tests.serving.statistics.support import Service
from tests.support.procs import wait_until
from tests.serving.statistics.worker_sim import make_events
from tests.support.procs import free_port

FAST = RecorderConfig(flush_interval_s=0.02, retry_attempts=2, retry_backoff_s=0.01)


class MemorySender:
    def __init__(self, fail_first: int = 0) -> None:
        self.batches: list[bytes] = []
        self.fail_first = fail_first

    def send(self, payload: bytes, count: int) -> None:
        if self.fail_first > 0:
            self.fail_first -= 1
            raise SendError("down")
        self.batches.append(payload)

    def failed_events(self) -> int:
        return 0

    def close(self, timeout: float) -> None:
        pass

    def events(self) -> list[dict]:
        return [e for b in self.batches for e in decode_batch(b).events]


def test_events_arrive_in_order_in_batches() -> None:
    sender = MemorySender()
    recorder = StatisticsRecorder(sender, RecorderConfig(max_batch=100, flush_interval_s=0.02), source="t:1")
    events = make_events("e", 1, 250, "reference", 1)
    for event in events:
        recorder.record(dict(event))
    assert recorder.flush(timeout=5)
    recorder.close()
    got = sender.events()
    assert [e["latency_s"] for e in got] == [e["latency_s"] for e in events]
    assert all("ts" in e for e in got)
    assert len(sender.batches) >= 3 and recorder.stats().sent == 250


def test_record_never_raises_and_counts_garbage() -> None:
    recorder = StatisticsRecorder(MemorySender(), FAST, source="t:1")
    recorder.record(None)  # type: ignore[arg-type]
    recorder.record("not an event")  # type: ignore[arg-type]
    recorder.close()
    recorder.record({"endpoint": "e"})  # after close: dropped, not raised
    assert recorder.stats().dropped == 3


def test_record_does_not_block_when_the_transport_stalls() -> None:
    release = threading.Event()

    class Stalled(MemorySender):
        def send(self, payload: bytes, count: int) -> None:
            release.wait(60)  # a transport that hangs until the test lets it go
            raise SendError("stalled")

    recorder = StatisticsRecorder(Stalled(), RecorderConfig(max_queue=1000, flush_interval_s=0.01, retry_attempts=1))
    start = time.perf_counter()
    for event in make_events("e", 1, 5000, "reference", 2):
        recorder.record(event)
    elapsed = time.perf_counter() - start
    # a record() that waited on the sender would take the sender's 60 s; not a timing test
    assert elapsed < 30, elapsed
    stats = recorder.stats()  # the queue holds 1000, one batch (max 1000) may be in the sender
    assert stats.queued <= 1000 and stats.dropped >= 3000, stats
    release.set()
    recorder.close(timeout=1)


def test_log_freq_samples_custom_variables_but_keeps_every_request() -> None:
    sender = MemorySender()
    draws = itertools.cycle([0.1, 0.6])  # deterministic "random": keep, drop, keep, ...
    recorder = StatisticsRecorder(sender, FAST, rng=lambda: next(draws))
    recorder.apply_snapshot({"revision": 3, "endpoints": {"e": {"log_freq": 0.5, "metrics": []},
                                                          "f": {"metrics": []}}})
    for event in make_events("e", 1, 10, "reference", 3) + make_events("f", 1, 10, "reference", 4):
        recorder.record(event)
    assert recorder.flush(timeout=5)
    recorder.close()
    got = sender.events()
    assert len(got) == 20  # request counts and latencies stay exact
    assert sum(1 for e in got if e["endpoint"] == "e" and e["custom"]) == 5
    assert all(e["custom"] for e in got if e["endpoint"] == "f")  # default log_freq 1.0


def test_retries_then_sends() -> None:
    sender = MemorySender(fail_first=1)
    recorder = StatisticsRecorder(sender, FAST)
    recorder.record(make_events("e", 1, 1, "reference", 5)[0])
    assert recorder.flush(timeout=5)
    recorder.close()
    assert recorder.stats().sent == 1 and recorder.stats().dropped == 0


def test_service_down_then_up_reports_the_loss(stats_service: Service) -> None:
    """Events lost while the service is unreachable show up in its dropped counter later."""
    def dropped_total() -> float:
        line = next(l for l in stats_service.metrics().splitlines() if l.startswith("serving_statistics_dropped_events_total"))
        return float(line.split()[-1])

    before = dropped_total()
    recorder = StatisticsRecorder(HttpSender(f"http://127.0.0.1:{free_port()}", timeout=1.0), FAST,
                                  source=f"recorder-test:{free_port()}")
    for event in make_events("count-e-lost", 1, 7, "reference", 6):
        recorder.record(event)
    recorder.flush(timeout=10)
    assert recorder.stats().dropped == 7 and recorder.stats().sent == 0

    recorder.sender = HttpSender(stats_service.url, token=stats_service.env["SERVING_WORKER_TOKEN"])  # the service is reachable again
    recorder.record(make_events("count-e-lost", 1, 1, "reference", 7)[0])
    assert recorder.flush(timeout=10)
    recorder.close()
    assert recorder.stats().sent == 1
    wait_until(lambda: dropped_total() - before == 7, what="7 dropped events reported")


def test_service_rejects_bad_envelopes(stats_service: Service) -> None:
    resp = httpx.post(stats_service.url + "/events", content=b"not json", headers=stats_service.headers)
    assert resp.status_code == 400
    resp = httpx.post(stats_service.url + "/events", content=b'{"schema": "other/v9", "events": []}', headers=stats_service.headers)
    assert resp.status_code == 400 and "unsupported schema" in resp.text
    # one bad event costs one counter increment, not the batch
    good = make_events("count-e-bad", 1, 2, "reference", 8)
    resp = httpx.post(stats_service.url + "/events", json={"events": [good[0], {"endpoint": ""}, good[1]]}, headers=stats_service.headers)
    assert resp.json() == {"accepted": 2}


@pytest.mark.parametrize("freq", [0.0, 1.0])
def test_set_log_freq_bounds(freq: float) -> None:
    sender = MemorySender()
    recorder = StatisticsRecorder(sender, FAST)
    recorder.set_log_freq("e", freq - 0.5 if freq == 0.0 else freq + 3)  # clamped into 0..1
    recorder.record(make_events("e", 1, 1, "reference", 9)[0])
    assert recorder.flush(timeout=5)
    recorder.close()
    assert bool(sender.events()[0]["custom"]) is (freq == 1.0)

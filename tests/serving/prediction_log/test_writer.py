"""The bounded queue between requests and the sink (serving/prediction_log/writer.py): while the sink is
down records wait, up to the bound, and reach it once it is back; past the bound they are dropped and
counted exactly, by endpoint; offering never blocks."""
from __future__ import annotations

import threading
import time

from serving.prediction_log.writer import PredictionLog, SinkError, WriterConfig
from tests.support.procs import wait_until


class Switchable:
    name = "test"

    def __init__(self) -> None:
        self.up = threading.Event()
        self.up.set()
        self.records: list[dict] = []
        self.refused = 0

    def write(self, records: list[dict]) -> None:
        if not self.up.is_set():
            self.refused += 1
            raise SinkError("down")
        self.records.extend(records)

    def close(self) -> None:
        pass


def test_records_wait_while_the_sink_is_down_and_past_the_bound_are_dropped_and_counted():
    sink, reports = Switchable(), []
    writer = PredictionLog(sink, WriterConfig(max_queue=100, max_batch=30, flush_interval_s=0.01, backoff_s=0.01,
                                              backoff_max_s=0.05), report=lambda *r: reports.append(r))
    try:
        sink.up.clear()
        t0 = time.perf_counter()
        for i in range(160):
            writer.offer({"endpoint": "a" if i % 2 else "b", "i": i})
        offered_s = time.perf_counter() - t0
        wait_until(lambda: sink.refused >= 3, 10, "the sink refused batches")
        assert writer.status()["queued"] == 100 and writer.status()["dropped"] == 60
        assert offered_s < 0.5, "offering never waits for the sink"
        sink.up.set()
        assert writer.flush(10)
        kept = sorted(r["i"] for r in sink.records)
        assert kept == list(range(100)), "every record below the bound reached the sink, none twice"
        assert writer.status() | {"sink_error": None} == {"sink": "test", "queued": 0, "written": 100,
                                                          "dropped": 60, "sink_error": None}
        wait_until(lambda: sum(r[1] for r in reports) == 100, 5, "the counts reported")
        by_endpoint = {e: (sum(r[1] for r in reports if r[0] == e), sum(r[2] for r in reports if r[0] == e))
                       for e in ("a", "b")}
        assert by_endpoint == {"a": (50, 30), "b": (50, 30)}
    finally:
        writer.close(1)


def test_a_close_while_the_sink_is_down_counts_what_it_could_not_write():
    sink = Switchable()
    sink.up.clear()
    writer = PredictionLog(sink, WriterConfig(flush_interval_s=0.01, backoff_s=0.01))
    for i in range(5):
        writer.offer({"endpoint": "a", "i": i})
    writer.close(0.3)
    assert writer.status()["dropped"] == 5 and sink.records == []
    writer.offer({"endpoint": "a"})
    assert writer.status()["dropped"] == 6, "closed: counted, not queued"

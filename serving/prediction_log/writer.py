"""The bounded queue between requests and the prediction log's sink.

Why a queue of its own rather than the statistics recorder's: statistics drop a batch after a few
failed sends (a rate is still right without it); a prediction log is a dataset, so a batch the sink
refuses is kept and tried again, with a growing pause, for as long as the sink is down. The request
path only appends to a deque (``offer``: no lock, no I/O, never raises). Records wait while the sink
is down; the bound counts them with the batch being retried, and only a record past it is dropped,
counted by endpoint. Nothing below the bound is lost, except what a stopping worker cannot hand to a
sink that is still down within its close timeout, which is counted as dropped too.

The counts leave the process as statistics events (``prediction_log``: records written and dropped
per endpoint since the last report), so the statistics service's ``/metrics`` shows them, and the
worker's ``/status`` shows this process's totals.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Callable, Protocol

log = logging.getLogger(__name__)


class SinkError(RuntimeError):
    """The sink did not take the batch; it is tried again."""


class Sink(Protocol):
    name: str

    def write(self, records: list[dict[str, Any]]) -> None:
        """Store every record of the batch, or raise (:class:`SinkError` or any other error)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class WriterConfig:
    max_queue: int = 10_000        # records held (queued and being retried); past it, dropped and counted
    max_batch: int = 500
    flush_interval_s: float = 0.2
    backoff_s: float = 0.1         # first pause after a refused batch, doubled up to backoff_max_s
    backoff_max_s: float = 5.0


Report = Callable[[str, int, int], None]  # endpoint, records written, records dropped (since the last report)


class PredictionLog:
    def __init__(self, sink: Sink, config: WriterConfig = WriterConfig(), report: Report | None = None) -> None:
        self.sink, self.config, self.report = sink, config, report
        self._queue: deque[dict[str, Any]] = deque()
        self._held = 0
        self.written: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()
        self._reported_written: Counter[str] = Counter()
        self._reported_dropped: Counter[str] = Counter()
        self.last_error: str | None = None
        self._count_lock = threading.Lock()
        self._closed = False
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name="prediction-log", daemon=True)
        self._thread.start()

    # --- request path -------------------------------------------------------------
    def offer(self, record: dict[str, Any]) -> None:
        """Queue one record; never blocks, never raises."""
        if self._closed or len(self._queue) + self._held >= self.config.max_queue:
            with self._count_lock:  # the writer thread reads these counts
                self.dropped[record.get("endpoint") or ""] += 1
            return
        self._queue.append(record)

    # --- what others read -----------------------------------------------------------
    def status(self) -> dict[str, Any]:
        with self._count_lock:
            written, dropped = sum(self.written.values()), sum(self.dropped.values())
        return {"sink": self.sink.name, "queued": len(self._queue) + self._held,
                "written": written, "dropped": dropped,
                "sink_error": self.last_error}

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is in the sink (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self._queue and not self._held:
                return True
            self._wake.set()
            time.sleep(0.01)
        return not self._queue and not self._held

    def close(self, timeout: float = 5.0) -> None:
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        with self._count_lock:
            for record in [*self._queue]:  # the sink stayed down through the close timeout
                self.dropped[record.get("endpoint") or ""] += 1
        self._queue.clear()
        self._report()
        try:
            self.sink.close()
        except Exception:
            log.exception("closing the prediction log's sink")

    # --- background thread ------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.config.flush_interval_s)
            self._wake.clear()
            try:
                self._drain()
                self._report()
            except Exception:  # the thread must outlive anything
                log.exception("prediction log")

    def _drain(self) -> None:
        while self._queue and not self._stop.is_set():
            batch = [self._queue.popleft() for _ in range(min(self.config.max_batch, len(self._queue)))]
            self._held = len(batch)
            try:
                self._write(batch)
            finally:
                self._held = 0

    def _write(self, batch: list[dict[str, Any]]) -> None:
        pause = self.config.backoff_s
        while True:
            try:
                self.sink.write(batch)
            except Exception as exc:
                if self.last_error is None:
                    log.warning("prediction log: the %s sink refused a batch (%s); records wait, up to %d",
                                self.sink.name, exc, self.config.max_queue)
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                self._report()
                if self._stop.wait(pause):
                    self._queue.extendleft(reversed(batch))  # counted as dropped by close(), if still unwritten
                    return
                pause = min(pause * 2, self.config.backoff_max_s)
                continue
            if self.last_error is not None:
                log.info("prediction log: the %s sink takes records again", self.sink.name)
            self.last_error = None
            with self._count_lock:
                self.written.update(r.get("endpoint") or "" for r in batch)
            return

    def _report(self) -> None:
        if self.report is None:
            return
        with self._count_lock:
            totals, dropped = dict(self.written), dict(self.dropped)
        for endpoint in set(totals) | set(dropped):
            written = totals.get(endpoint, 0) - self._reported_written[endpoint]
            lost = dropped.get(endpoint, 0) - self._reported_dropped[endpoint]
            if written or lost:
                self._reported_written[endpoint] += written
                self._reported_dropped[endpoint] += lost
                try:
                    self.report(endpoint, written, lost)
                except Exception:
                    log.exception("prediction log: reporting its counts")

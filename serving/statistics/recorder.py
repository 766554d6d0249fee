"""The worker side: ``StatisticsRecorder.record(event)`` on every request.

Why it is built this way: recording must never slow or fail a request. ``record``
therefore only appends the event dict to a bounded ``deque`` (no lock, no
condition-variable wake-up per event) and returns; a daemon thread wakes every
``flush_interval_s``, takes up to ``max_batch`` events, encodes them once and hands
them to a transport. When the queue is full or the transport keeps failing, events
are dropped and counted (the count travels in each batch envelope), never raised.

Sampling (``log_freq`` of the endpoint, from the control plane): every request is
still counted with its status and latency, so request rates, error rates and the
canary share stay exact; ``log_freq`` samples which events keep their ``custom``
variables, the part that feeds variable metrics and drift windows.
"""
from __future__ import annotations

import atexit
import logging
import os
import random
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from serving.settings import StatisticsSettings, WorkerSettings
from serving.statistics.definitions import parse_snapshot
from serving.statistics.events import encode_batch
from serving.statistics.transports import SendError, Sender

if TYPE_CHECKING:
    from serving.statistics.transports.kafka import KafkaOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RecorderConfig:
    max_queue: int = 100_000       # events held while the transport is slow; beyond: dropped
    max_batch: int = 1_000         # events per envelope (one POST / one Kafka message)
    flush_interval_s: float = 0.1  # how stale a statistic may get before it is sent
    retry_attempts: int = 3        # per batch, then the batch is dropped and counted
    retry_backoff_s: float = 0.25


@dataclass(frozen=True)
class RecorderStats:
    queued: int
    sent: int
    dropped: int


def default_source() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class StatisticsRecorder:
    def __init__(self, sender: Sender, config: RecorderConfig = RecorderConfig(),
                 source: str | None = None, rng: Callable[[], float] = random.random) -> None:
        self.sender, self.config = sender, config
        self.source = source or default_source()
        self._random = rng
        self._queue: deque[dict[str, Any]] = deque()
        self._log_freq: dict[str, float] = {}
        self._dropped = self._sent = 0
        self._count_lock = threading.Lock()
        self._wake, self._stop, self._idle = threading.Event(), threading.Event(), threading.Event()
        self._closed = False
        self._on_close: list[Callable[[], None]] = []
        self._thread = threading.Thread(target=self._run, name="statistics-recorder", daemon=True)
        self._thread.start()

    # --- request path -------------------------------------------------------------
    def record(self, event: dict[str, Any]) -> None:
        """Queue one event; never blocks, never raises. The recorder owns ``event`` afterwards."""
        try:
            freq = self._log_freq.get(event.get("endpoint"), 1.0)
            if freq < 1.0 and event.get("custom") and self._random() >= freq:
                event = {**event, "custom": {}}
            if "ts" not in event:
                event["ts"] = time.time()
            if self._closed or len(self._queue) >= self.config.max_queue:
                self._count_dropped(1)
                return
            self._queue.append(event)
        except Exception:  # a malformed event must not reach the request
            self._count_dropped(1)

    def record_load(self, endpoint: str, version: int | None, *, model: str, engine: str, state: str,
                    reason: str | None = None) -> None:
        """A model load outcome of this process (serving/worker/gate.py): ``state`` ``failed`` (one
        attempt; ``reason``: ``model`` or ``preprocess``), ``ready`` (it takes traffic here) or
        ``retired`` (neither routed nor failing here any more).
        Queued like a request's event; the service counts it in the model-load series only."""
        self.record({"ts": time.time(), "endpoint": endpoint, "version": version,
                     "model_state": {"state": state, "model": model, "engine": engine, "reason": reason}})

    # --- configuration ------------------------------------------------------------
    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Take each endpoint's ``log_freq`` from a control-plane snapshot."""
        self._log_freq = {name: d.log_freq for name, d in parse_snapshot(snapshot).items()}

    def set_log_freq(self, endpoint: str, freq: float) -> None:
        self._log_freq = {**self._log_freq, endpoint: min(1.0, max(0.0, freq))}

    def on_close(self, callback: Callable[[], None]) -> None:
        self._on_close.append(callback)

    # --- lifecycle ----------------------------------------------------------------
    def stats(self) -> RecorderStats:
        with self._count_lock:
            return RecorderStats(queued=len(self._queue), sent=self._sent, dropped=self._total_dropped())

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far has been handed to the transport."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._idle.clear()
            self._wake.set()
            if self._idle.wait(max(0.0, deadline - time.monotonic())) and not self._queue:
                return True
        return not self._queue

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (within ``timeout``), then stop the thread and transport."""
        if self._closed:
            return
        self._closed = True
        for callback in self._on_close:
            callback()
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)
        try:
            self.sender.close(timeout)
        except Exception:
            log.exception("closing statistics transport")

    # --- background thread --------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self.config.flush_interval_s)
            self._wake.clear()
            stopping = self._stop.is_set()
            try:
                self._drain()
            except Exception:  # the thread must survive anything
                log.exception("statistics recorder")
            self._idle.set()
            if stopping:
                return

    def _drain(self) -> None:
        while self._queue:
            batch = self._take(self.config.max_batch)
            try:
                self._send(batch)
            except Exception:  # e.g. an unencodable custom value: lose this batch only
                log.exception("statistics batch of %d events dropped", len(batch))
                self._count_dropped(len(batch))

    def _take(self, n: int) -> list[dict[str, Any]]:
        batch: list[dict[str, Any]] = []
        popleft = self._queue.popleft
        try:
            for _ in range(n):
                batch.append(popleft())
        except IndexError:
            pass
        return batch

    def _send(self, batch: list[dict[str, Any]]) -> None:
        if not batch:
            return
        payload = encode_batch(batch, source=self.source, dropped=self._total_dropped())
        for attempt in range(self.config.retry_attempts):
            try:
                self.sender.send(payload, len(batch))
            except SendError as exc:
                log.debug("statistics send failed (attempt %d): %s", attempt + 1, exc)
                if self._stop.wait(self.config.retry_backoff_s * 2 ** attempt):
                    break  # closing: do not hold shutdown hostage to a dead service
                continue
            with self._count_lock:
                self._sent += len(batch)
            return
        log.warning("dropping %d statistics events: transport unavailable", len(batch))
        self._count_dropped(len(batch))

    def _count_dropped(self, n: int) -> None:
        with self._count_lock:
            self._dropped += n

    def _total_dropped(self) -> int:
        try:
            return self._dropped + self.sender.failed_events()
        except Exception:
            return self._dropped


def recorder_from_settings(settings: WorkerSettings, *, follow_config: bool = True,
                           config: RecorderConfig = RecorderConfig(),
                           kafka: KafkaOptions | None = None) -> StatisticsRecorder:
    """The recorder a worker uses: Kafka when ``SERVING_KAFKA_BOOTSTRAP_SERVERS`` is set,
    else the embedded HTTP transport to ``SERVING_STATISTICS_HOST``/``_PORT``.

    With ``follow_config`` the recorder follows the control plane itself for
    ``log_freq``; a worker that already follows it may pass ``False`` and call
    ``recorder.apply_snapshot(snapshot)`` from its own subscriber instead.
    """
    from serving.credentials import worker_token

    source = default_source()
    if settings.kafka_bootstrap_servers:
        from serving.statistics.transports.kafka import KafkaOptions, KafkaSender

        sender: Sender = KafkaSender(settings.kafka_bootstrap_servers, settings.kafka_topic,
                                     key=source.encode(), options=kafka or KafkaOptions())
    else:
        from serving.statistics.transports.embedded import HttpSender

        sender = HttpSender(statistics_url(settings), token=lambda: worker_token(settings))
    recorder = StatisticsRecorder(sender, config=config, source=source)
    if follow_config:
        from serving.config_client import ConfigSubscriber

        subscriber = ConfigSubscriber(settings.control_plane_url, recorder.apply_snapshot,
                                      token=lambda: worker_token(settings)).start()
        recorder.on_close(subscriber.stop)
    atexit.register(recorder.close)
    return recorder


def statistics_url(settings: WorkerSettings | StatisticsSettings) -> str:
    """Where workers reach the statistics service (a wildcard bind means this host).

    Taken from the settings object given, not from the environment again, so a
    worker configured in code (tests, embedding) posts where it was told to."""
    host = settings.statistics_host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{settings.statistics_port}"

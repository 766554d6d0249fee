"""Kafka transport (kafka-python): a producer in each worker, a consumer in the service.

One Kafka message is one recorder batch (the envelope of ``events.py``), keyed by
the sender's ``host:pid``: the recorder already batches, so one message per event
would only multiply per-message overhead in the worker. kafka-python batches
further (``linger_ms``) and retries transient broker errors itself; messages that
still fail are counted as dropped, never raised into a request.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError

from serving.statistics.transports import SendError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KafkaOptions:
    """Producer and consumer knobs; the defaults suit one statistics service."""

    acks: int | str = 1            # 0, 1 or "all"
    retries: int = 5
    linger_ms: int = 20
    compression_type: str | None = None  # e.g. "gzip": less network, more worker CPU
    max_block_ms: int = 5_000      # how long send() may wait for buffer space, metadata or bootstrap
    reconnect_backoff_max_ms: int = 5_000  # a broker back from an outage is found within this
    group_id: str | None = "serving-statistics"  # None: read all partitions, no group
    auto_offset_reset: str = "earliest"  # a new group starts from retained history
    partitions: int = 1            # used only when the service creates the topic


def _servers(bootstrap: str) -> list[str]:
    return [s.strip() for s in bootstrap.split(",") if s.strip()]


class KafkaSender:
    def __init__(self, bootstrap: str, topic: str, key: bytes, options: KafkaOptions = KafkaOptions()) -> None:
        self.bootstrap, self.topic, self.key, self.options = bootstrap, topic, key, options
        self._failed = 0
        self._lock = threading.Lock()
        self._producer: KafkaProducer | None = None

    def _connect(self) -> KafkaProducer:
        """Connect lazily, from the recorder thread: a broker that is down at worker
        start must not stop the worker from starting."""
        if self._producer is None:
            o = self.options
            self._producer = KafkaProducer(
                bootstrap_servers=_servers(self.bootstrap), acks=o.acks, retries=o.retries,
                linger_ms=o.linger_ms, compression_type=o.compression_type,
                max_block_ms=o.max_block_ms, bootstrap_timeout_ms=o.max_block_ms,
                reconnect_backoff_max_ms=o.reconnect_backoff_max_ms,
            )
        return self._producer

    def send(self, payload: bytes, count: int) -> None:
        try:
            future = self._connect().send(self.topic, value=payload, key=self.key)
        except KafkaError as exc:  # no broker, buffer full, metadata timeout: retryable
            raise SendError(str(exc)) from exc
        future.add_errback(lambda exc: self._count_failure(exc, count))

    def _count_failure(self, exc: Exception, count: int) -> None:
        log.warning("kafka: %d statistics events lost: %s", count, exc)
        with self._lock:
            self._failed += count

    def failed_events(self) -> int:
        with self._lock:
            return self._failed

    def close(self, timeout: float) -> None:
        if self._producer is None:
            return
        try:
            self._producer.flush(timeout=timeout)
        finally:
            self._producer.close(timeout=timeout)


def ensure_topic(bootstrap: str, topic: str, partitions: int = 1, timeout_ms: int = 10_000) -> None:
    """Create the topic if the broker lacks it; best effort (brokers may forbid it)."""
    try:
        admin = KafkaAdminClient(bootstrap_servers=_servers(bootstrap), bootstrap_timeout_ms=timeout_ms)
    except KafkaError as exc:
        log.warning("kafka admin unavailable: %s", exc)
        return
    try:
        if topic not in admin.list_topics():
            admin.create_topics([NewTopic(topic, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    except KafkaError as exc:
        log.warning("could not create topic %s: %s", topic, exc)
    finally:
        admin.close()


class KafkaBatchConsumer:
    """Feeds each message value to ``handle`` from a daemon thread, until stopped."""

    def __init__(self, bootstrap: str, topic: str, handle: Callable[[bytes], None],
                 options: KafkaOptions = KafkaOptions()) -> None:
        self.bootstrap, self.topic, self.handle, self.options = bootstrap, topic, handle, options
        self.ready = threading.Event()  # set once partitions are assigned
        self._stop = threading.Event()
        # next offset per partition: without a group nothing is committed, so a
        # reconnect resumes from here instead of re-reading (and double counting)
        self._positions: dict[TopicPartition, int] = {}
        self._thread = threading.Thread(target=self._run, name="kafka-statistics", daemon=True)

    def start(self) -> "KafkaBatchConsumer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _consumer(self) -> KafkaConsumer:
        o = self.options
        if o.group_id:
            return KafkaConsumer(self.topic, bootstrap_servers=_servers(self.bootstrap), group_id=o.group_id,
                                 auto_offset_reset=o.auto_offset_reset, enable_auto_commit=True)
        consumer = KafkaConsumer(bootstrap_servers=_servers(self.bootstrap), group_id=None,
                                 auto_offset_reset=o.auto_offset_reset, enable_auto_commit=False)
        partitions = self._wait_partitions(consumer)
        consumer.assign([TopicPartition(self.topic, p) for p in sorted(partitions)])
        for tp, offset in self._positions.items():
            consumer.seek(tp, offset)
        return consumer

    def _wait_partitions(self, consumer: KafkaConsumer) -> set[int]:
        while not self._stop.is_set():
            partitions = consumer.partitions_for_topic(self.topic)
            if partitions:
                return partitions
            self._stop.wait(0.5)
        return set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume(self._consumer())
            except KafkaError as exc:
                log.warning("kafka consumer: %s; reconnecting", exc)
                self._stop.wait(1.0)
            except Exception:  # keep the service alive whatever a message contains
                log.exception("kafka consumer failed; reconnecting")
                self._stop.wait(1.0)

    def _consume(self, consumer: KafkaConsumer) -> None:
        try:
            while not self._stop.is_set():
                records = consumer.poll(timeout_ms=500)
                if consumer.assignment():
                    self.ready.set()
                for tp, batch in records.items():
                    for record in batch:
                        self.handle(record.value)
                        self._positions[tp] = record.offset + 1
        finally:
            consumer.close()

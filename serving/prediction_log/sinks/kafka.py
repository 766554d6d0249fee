"""Kafka: one message per record, keyed by its request id (a request's live and shadow records land in
one partition, in order), JSON as the files hold it. A batch is flushed and every send checked before
the writer counts it written; any failure raises, and the writer sends the whole batch again, so a
record may arrive twice (at least once: ``serving log export`` keeps one record per request id and
kind). The producer connects lazily, from the writer's thread: a broker down at worker start does not
stop the worker."""
from __future__ import annotations

from typing import Any

import orjson

from serving.prediction_log.writer import SinkError

FLUSH_TIMEOUT_S = 10.0


class KafkaRecords:
    name = "kafka"

    def __init__(self, bootstrap: str, topic: str, max_block_ms: int = 5_000) -> None:
        self.bootstrap, self.topic, self.max_block_ms = bootstrap, topic, max_block_ms
        self._producer: Any = None

    def _connect(self) -> Any:
        if self._producer is None:
            from kafka import KafkaProducer

            from serving.statistics.transports.kafka import ensure_topic

            ensure_topic(self.bootstrap, self.topic)  # a broker that does not create topics on first use

            self._producer = KafkaProducer(
                bootstrap_servers=[s.strip() for s in self.bootstrap.split(",") if s.strip()], acks=1,
                retries=3, linger_ms=5, max_block_ms=self.max_block_ms, bootstrap_timeout_ms=self.max_block_ms,
                reconnect_backoff_max_ms=5_000)
        return self._producer

    def write(self, records: list[dict[str, Any]]) -> None:
        from kafka.errors import KafkaError

        try:
            producer = self._connect()
            sent = [producer.send(self.topic, key=(r.get("request_id") or "").encode(),
                                  value=orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY)) for r in records]
            producer.flush(FLUSH_TIMEOUT_S)
            for future in sent:
                future.get(timeout=0)
        except KafkaError as exc:
            raise SinkError(f"kafka {self.bootstrap} topic {self.topic}: {exc}") from exc

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None

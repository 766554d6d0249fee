"""The Kafka transport against a real Kafka-protocol broker: producer, consumer, and the whole path.

Worker processes record through ``recorder_from_settings`` with
``SERVING_KAFKA_BOOTSTRAP_SERVERS`` set (so they produce to Kafka), and the
statistics service consumes the topic and exports what it read.
"""
from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from serving.statistics.events import decode_batch, encode_batch
from serving.statistics.recorder import RecorderConfig, StatisticsRecorder
from serving.statistics.transports import SendError
from serving.statistics.transports.kafka import KafkaBatchConsumer, KafkaOptions, KafkaSender, ensure_topic
from tests.serving.statistics.fake_control_plane import FakeControlPlane
from tests.serving.statistics.kafka_broker import kafka_broker
from tests.serving.statistics.support import run_workers, statistics_service
from tests.support.procs import wait_until
from tests.serving.statistics.worker_sim import make_events
from tests.support.procs import free_port


@pytest.fixture(scope="module")
def bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with kafka_broker(tmp_path_factory.mktemp("kafka")) as address:
        yield address


def topic() -> str:
    return f"serving-statistics-test-{uuid.uuid4().hex[:8]}"


class Collected:
    def __init__(self) -> None:
        self.values: list[bytes] = []
        self.lock = threading.Lock()

    def __call__(self, value: bytes) -> None:
        with self.lock:
            self.values.append(value)

    def events(self) -> list[dict]:
        with self.lock:
            return [e for v in self.values for e in decode_batch(v).events]


@pytest.mark.parametrize("group", [None, "serving-statistics-test"], ids=["assigned", "consumer-group"])
def test_producer_to_consumer_round_trip(bootstrap: str, group: str | None) -> None:
    name = topic()
    ensure_topic(bootstrap, name)
    got = Collected()
    options = KafkaOptions(group_id=group and f"{group}-{name}", acks="all")
    consumer = KafkaBatchConsumer(bootstrap, name, got, options).start()
    sender = KafkaSender(bootstrap, name, key=b"host:1", options=options)
    try:
        sent = make_events("kafka-e", 1, 120, "reference", 61)
        for i in range(0, 120, 40):
            sender.send(encode_batch(sent[i:i + 40], source="host:1"), 40)
        sender.close(timeout=10)
        assert sender.failed_events() == 0
        wait_until(lambda: len(got.events()) >= 120, timeout=60, what="consumer reads 120 events")
        time.sleep(0.5)  # anything more would be a duplicate
        assert got.events() == sent
        assert consumer.ready.is_set()
    finally:
        consumer.stop()


def test_unreachable_broker_drops_and_counts_never_raises() -> None:
    sender = KafkaSender(f"127.0.0.1:{free_port()}", topic(), key=b"k", options=KafkaOptions(max_block_ms=300))
    with pytest.raises(SendError):
        sender.send(b"{}", 1)
    recorder = StatisticsRecorder(sender, RecorderConfig(flush_interval_s=0.05, retry_attempts=1), source="t:1")
    for event in make_events("kafka-e", 1, 5, "reference", 62):
        recorder.record(event)
    recorder.flush(timeout=10)
    recorder.close(timeout=2)
    assert recorder.stats().dropped == 5 and recorder.stats().sent == 0


def test_workers_to_statistics_service_through_kafka(bootstrap: str, tmp_path: Path,
                                                     control_plane: FakeControlPlane) -> None:
    name = topic()
    kafka_env = {"SERVING_KAFKA_BOOTSTRAP_SERVERS": bootstrap, "SERVING_KAFKA_TOPIC": name}
    home = tmp_path / "home"
    home.mkdir()
    with statistics_service(home, control_plane.url, args=["--kafka-group", ""], extra_env=kafka_env) as service:
        wait_until(lambda: service.health()["kafka"] is True, timeout=30, what="consumer assigned")
        worker_env = {**service.env, "SERVING_STATISTICS_PORT": str(free_port())}  # the HTTP path is closed
        results = run_workers(worker_env, [("kafka-e", 1, 400, "reference", 63), ("kafka-e", 2, 250, "shifted", 64)])
        assert [r["dropped"] for r in results] == [0, 0]

        def requests() -> float:
            families = text_string_to_metric_families(service.metrics())
            return sum(s.value for f in families for s in f.samples
                       if s.name == "serving_requests_total" and s.labels["endpoint"] == "kafka-e")

        wait_until(lambda: requests() >= 650, timeout=30, what="650 requests counted")
        time.sleep(1.0)
        assert requests() == 650
        text = service.metrics()
        assert 'serving_variable_scalar_count{endpoint="kafka-e",variable="tokens",version="2"} 250.0' in text
        assert 'serving_statistics_events_total{result="accepted"} 650.0' in text

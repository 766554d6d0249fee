"""The Kafka sink on a real Kafka-protocol broker (Tansu): one message per record keyed by its request id,
read back by a stock consumer; a broker that is down when the worker starts gets every record once it is
up (they waited in the writer's queue)."""
from __future__ import annotations

import uuid

import orjson
from kafka import KafkaConsumer

from serving.prediction_log.sinks.kafka import KafkaRecords
from serving.prediction_log.writer import PredictionLog, WriterConfig
from tests.serving.statistics.kafka_broker import kafka_broker
from tests.support.procs import free_port, wait_until


def read_all(bootstrap: str, topic: str, n: int) -> list:
    consumer = KafkaConsumer(topic, bootstrap_servers=[bootstrap], auto_offset_reset="earliest",
                             consumer_timeout_ms=2000, group_id=None)
    got: list = []
    try:
        for _ in range(30):
            got += list(consumer)
            if len(got) >= n:
                break
    finally:
        consumer.close()
    return got


def test_records_reach_the_topic_keyed_by_request_id(tmp_path):
    topic = f"predictions-{uuid.uuid4().hex[:8]}"
    with kafka_broker(tmp_path) as bootstrap:
        sink = KafkaRecords(bootstrap, topic)
        records = [{"request_id": f"r{i}", "endpoint": "e", "inputs": {"text": f"t{i}"}} for i in range(20)]
        sink.write(records[:10])
        sink.write(records[10:])
        sink.close()
        got = read_all(bootstrap, topic, 20)
    assert sorted((m.key.decode(), orjson.loads(m.value)["inputs"]["text"]) for m in got) == \
        sorted((f"r{i}", f"t{i}") for i in range(20))


def test_a_broker_down_at_start_gets_every_record_once_it_is_up(tmp_path):
    topic, port = f"predictions-{uuid.uuid4().hex[:8]}", free_port()
    writer = PredictionLog(KafkaRecords(f"127.0.0.1:{port}", topic, max_block_ms=1000),
                           WriterConfig(flush_interval_s=0.05, backoff_s=0.2, backoff_max_s=1.0))
    try:
        for i in range(50):
            writer.offer({"request_id": f"r{i}", "endpoint": "e"})
        wait_until(lambda: writer.status()["sink_error"] is not None, 30, "the sink refusing while the broker is down")
        assert writer.status()["queued"] == 50 and writer.status()["written"] == 0
        with kafka_broker(tmp_path, port=port) as bootstrap:
            wait_until(lambda: writer.status()["written"] == 50, 60, "the waiting records written")
            got = read_all(bootstrap, topic, 50)
            assert writer.status()["dropped"] == 0 and writer.status()["sink_error"] is None
    finally:
        writer.close(2)
    assert sorted(m.key.decode() for m in got) == sorted(f"r{i}" for i in range(50)), "every record, once each"

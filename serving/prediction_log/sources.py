"""Where ``serving log export`` reads prediction-log records from, one at a time (never all at once):
the ``files`` sink's folder, or the ``kafka`` sink's topic from its first offset to about the end it
had when the read started (what the broker's last fetch brings is read whole; later records wait for
the next export)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import orjson

Progress = Callable[[int], None]  # called with the bytes (files) or messages (Kafka) read since the last call


def file_records(folder: Path, progress: Progress = lambda n: None) -> Iterator[dict[str, Any]]:
    """Every record of every ``*.jsonl`` in ``folder``, file by file in name order (each worker process's
    files sort by their start time). A line cut short (a worker killed mid-write) is skipped."""
    for path in sorted(Path(folder).glob("*.jsonl")):
        with open(path, "rb") as f:
            for line in f:
                progress(len(line))
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(record, dict):
                    yield record


def files_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).glob("*.jsonl"))


def kafka_records(bootstrap: str, topic: str, progress: Progress = lambda n: None,
                  timeout_ms: int = 10_000) -> Iterator[dict[str, Any]]:
    """Every record of ``topic`` up to the end offsets it had when the read started."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=[s.strip() for s in bootstrap.split(",") if s.strip()],
                             group_id=None, enable_auto_commit=False, consumer_timeout_ms=timeout_ms)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            return
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = {tp: end for tp, end in consumer.end_offsets(partitions).items() if end > 0}
        while ends:
            batch = consumer.poll(timeout_ms=timeout_ms)
            if not batch:
                break  # the broker went quiet before the ends it named: stop with what was read
            for tp, messages in batch.items():
                for message in messages:  # a fetch past the end (written meanwhile) is read whole: a
                    progress(1)           # broker may name the last batch's start as its end (Tansu)
                    try:
                        record = orjson.loads(message.value)
                    except orjson.JSONDecodeError:
                        continue
                    if isinstance(record, dict):
                        yield record
                if tp in ends and consumer.position(tp) >= ends[tp]:
                    del ends[tp]
    finally:
        consumer.close()


def kafka_size(bootstrap: str, topic: str) -> int:
    """Messages in the topic now (for the progress bar)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=[s.strip() for s in bootstrap.split(",") if s.strip()], group_id=None)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        starts, ends = consumer.beginning_offsets(partitions), consumer.end_offsets(partitions)
        return sum(ends[tp] - starts[tp] for tp in partitions)
    finally:
        consumer.close()

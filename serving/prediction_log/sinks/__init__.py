"""Where prediction-log records go (writer.py's ``Sink``): ``files`` (rotating JSON Lines, the embedded
default), ``kafka`` (a topic per deployment, compose and Helm), ``off``. Adding one is a module here
and a line in :data:`SINKS`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from serving.prediction_log.writer import Sink
    from serving.settings import WorkerSettings


def _files(settings: "WorkerSettings", source: str) -> "Sink":
    from serving.prediction_log.sinks.files import RotatingFiles

    return RotatingFiles(settings.resolved_prediction_log_dir(), source,
                         max_bytes=settings.prediction_log_file_mb * 1_048_576,
                         keep=settings.prediction_log_keep_files)


def _kafka(settings: "WorkerSettings", source: str) -> "Sink":
    from serving.prediction_log.sinks.kafka import KafkaRecords

    if not settings.kafka_bootstrap_servers:
        raise ValueError("SERVING_PREDICTION_LOG_SINK=kafka needs SERVING_KAFKA_BOOTSTRAP_SERVERS")
    return KafkaRecords(settings.kafka_bootstrap_servers, settings.prediction_log_topic)


SINKS: dict[str, Callable[["WorkerSettings", str], "Sink"]] = {"files": _files, "kafka": _kafka}

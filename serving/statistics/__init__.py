"""Per-request statistics: recorder (workers), transports, Prometheus exporter, drift.

Entry points: :func:`recorder_from_settings` (workers) and
:func:`serving.statistics.service.run_statistics_service` (the statistics process).
"""
from serving.statistics.recorder import RecorderConfig, StatisticsRecorder, recorder_from_settings

__all__ = ["RecorderConfig", "StatisticsRecorder", "recorder_from_settings"]

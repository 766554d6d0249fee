"""Drift scores as Prometheus gauges, computed when Prometheus scrapes.

Computing at scrape time (only for series that received values since the last
scrape) keeps the ingestion path free of scipy and never exports a stale score.
"""
from __future__ import annotations

from typing import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from serving.statistics.drift import DriftMonitor

LABELS = ["endpoint", "version", "variable"]


class DriftCollector:
    def __init__(self, monitor: DriftMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        psi = GaugeMetricFamily("serving_drift_psi", "Population stability index, live window vs reference.",
                                labels=LABELS)
        ks_stat = GaugeMetricFamily("serving_drift_ks_statistic",
                                    "Two-sample Kolmogorov-Smirnov statistic (numeric variables).", labels=LABELS)
        ks_p = GaugeMetricFamily("serving_drift_ks_pvalue",
                                 "Two-sample Kolmogorov-Smirnov p-value (numeric variables).", labels=LABELS)
        flag = GaugeMetricFamily("serving_drift_detected", "1 when PSI is at or above the threshold, else 0.",
                                 labels=LABELS)
        ref_n = GaugeMetricFamily("serving_drift_reference_size", "Values in the reference distribution.",
                                  labels=LABELS)
        win_n = GaugeMetricFamily("serving_drift_window_size", "Values in the live window.", labels=LABELS)
        for key, score in self.monitor.scores().items():
            labels = list(key)
            psi.add_metric(labels, score.psi)
            flag.add_metric(labels, 1.0 if score.drifted else 0.0)
            ref_n.add_metric(labels, score.reference_size)
            win_n.add_metric(labels, score.window_size)
            if score.ks_statistic is not None:
                ks_stat.add_metric(labels, score.ks_statistic)
                ks_p.add_metric(labels, score.ks_pvalue)
        threshold = GaugeMetricFamily("serving_drift_psi_threshold", "PSI at or above which drift is flagged.",
                                      value=self.monitor.config.psi_threshold)
        yield from (psi, ks_stat, ks_p, flag, ref_n, win_n, threshold)

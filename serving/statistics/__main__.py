"""``python -m serving.statistics``: run the statistics service (settings from SERVING_*).

The flags tune drift detection and the Kafka consumer; everything shared with other
processes stays in environment settings (``serving/settings.py``).
"""
from __future__ import annotations

import argparse
import logging

from serving.settings import StatisticsSettings
from serving.statistics.drift import DriftConfig
from serving.statistics.service import run_statistics_service
from serving.statistics.transports.kafka import KafkaOptions


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d, k = DriftConfig(), KafkaOptions()
    p = argparse.ArgumentParser(prog="python -m serving.statistics", description=__doc__)
    p.add_argument("--reference-size", type=int, default=d.reference_size, help="values that form a reference")
    p.add_argument("--window-size", type=int, default=d.window_size, help="live window length")
    p.add_argument("--min-window", type=int, default=d.min_window, help="values needed before scoring")
    p.add_argument("--psi-threshold", type=float, default=d.psi_threshold, help="PSI that flags drift")
    p.add_argument("--kafka-group", default=k.group_id,
                   help="consumer group; empty: read every partition without a group")
    p.add_argument("--kafka-offset-reset", default=k.auto_offset_reset, choices=["earliest", "latest"])
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    drift = DriftConfig(reference_size=args.reference_size, window_size=args.window_size,
                        min_window=args.min_window, psi_threshold=args.psi_threshold)
    kafka = KafkaOptions(group_id=args.kafka_group or None, auto_offset_reset=args.kafka_offset_reset)
    run_statistics_service(StatisticsSettings(), drift=drift, kafka=kafka)


if __name__ == "__main__":
    main()

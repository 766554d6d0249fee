"""A Prometheus configuration pointed at the statistics service (and Triton, if any).

``serving up`` can write this and start Debian's/any ``prometheus`` binary with it;
the tests start a real Prometheus from the same function, so what ships is what
is tested. Alert rules live in ``deploy/prometheus/alerts.yml``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml

REPO = Path(__file__).resolve().parents[2]
ALERT_RULES = REPO / "deploy" / "prometheus" / "alerts.yml"


def prometheus_config(statistics_targets: Sequence[str], triton_targets: Sequence[str] = (),
                      rule_files: Sequence[Path] = (ALERT_RULES,), scrape_interval: str = "15s",
                      evaluation_interval: str | None = None) -> dict[str, Any]:
    """Targets are ``host:port``; the statistics job name is what the alert rules expect."""
    jobs: list[dict[str, Any]] = [{"job_name": "serving-statistics", "static_configs": [
        {"targets": list(statistics_targets)}]}]
    if triton_targets:
        jobs.append({"job_name": "triton", "static_configs": [{"targets": list(triton_targets)}]})
    return {
        "global": {"scrape_interval": scrape_interval,
                   "evaluation_interval": evaluation_interval or scrape_interval},
        "rule_files": [str(p) for p in rule_files if Path(p).exists()],
        "scrape_configs": jobs,
    }


def write_prometheus_config(path: Path, statistics_targets: Sequence[str], **kwargs: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(prometheus_config(statistics_targets, **kwargs), sort_keys=False))
    return path


def prometheus_command(config: Path, data_dir: Path, listen: str, binary: str = "prometheus") -> list[str]:
    """Command line for a foreground Prometheus with its own data dir (never a system service)."""
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address={listen}", "--web.enable-lifecycle", "--log.level=warn"]

"""A Prometheus configuration pointed at the statistics service (and Triton and the LLM launcher, if any).

``serving up`` can write this and start Debian's/any ``prometheus`` binary with it;
the tests start a real Prometheus from the same function, so what ships is what
is tested. Alert rules live in ``deploy/prometheus/alerts.yml``.
"""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERT_RULES = REPO / "deploy" / "prometheus" / "alerts.yml"


def prometheus_config(statistics_targets: Sequence[str], triton_targets: Sequence[str] = (),
                      llm_targets: Sequence[str] = (), rule_files: Sequence[Path] = (ALERT_RULES,), scrape_interval: str = "15s",
                      evaluation_interval: str | None = None) -> dict[str, Any]:
    """Targets are ``host:port``; the statistics job name is what the alert rules expect."""
    jobs: list[dict[str, Any]] = [{"job_name": "serving-statistics", "static_configs": [
        {"targets": list(statistics_targets)}]}]
    if triton_targets:
        jobs.append({"job_name": "triton", "static_configs": [{"targets": list(triton_targets)}]})
    if llm_targets:  # the launcher's /metrics: its engines' own, labelled with endpoint and version
        jobs.append({"job_name": "serving-llm", "static_configs": [{"targets": list(llm_targets)}]})
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


def start_prometheus(workdir: Path, statistics_targets: Sequence[str], listen: str,
                     triton_targets: Sequence[str] = (), scrape_interval: str = "15s",
                     timeout: float = 60.0, llm_targets: Sequence[str] = (),
                     rule_files: Sequence[Path] = (ALERT_RULES,)) -> subprocess.Popen:
    """Write the config under ``workdir`` and start Prometheus in its own session (so a
    supervisor can stop it with its process group); returns once it answers ``/-/ready``.

    Raises ``FileNotFoundError`` when no ``prometheus`` binary is on PATH and
    ``RuntimeError`` when it exits or does not become ready (it is stopped then).
    """
    binary = shutil.which("prometheus")
    if binary is None:
        raise FileNotFoundError("prometheus is not installed (e.g. apt-get install prometheus)")
    config = write_prometheus_config(workdir / "prometheus.yml", statistics_targets,
                                     triton_targets=triton_targets, llm_targets=llm_targets,
                                     scrape_interval=scrape_interval, rule_files=rule_files)
    with open(workdir / "prometheus.log", "ab") as log:
        proc = subprocess.Popen(prometheus_command(config, workdir / "data", listen, binary), cwd=workdir,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://{listen}/-/ready"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.terminate()
    proc.wait(10)
    raise RuntimeError(f"prometheus did not become ready on {listen}; see {workdir / 'prometheus.log'}")

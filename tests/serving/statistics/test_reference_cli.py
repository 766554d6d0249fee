"""`serving metrics reference upload|show|reset` against the real statistics service.

An uploaded reference replaces the "first N values after a deploy" rule: drift is
scored from the first live window on, for every version (``--version *``).
"""
from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from serving.cli.main import app
from tests.serving.statistics.support import WORKER_TOKEN, Service, run_workers
from tests.support.procs import wait_until
from tests.serving.statistics.worker_sim import make_events
from tests.support.procs import free_port

runner = CliRunner()


def cli(service_url: str, *args: str):
    # the CLI sends SERVING_TOKEN; reference changes need a worker, deployer or admin token
    return runner.invoke(app, ["metrics", "reference", *args, "--statistics-url", service_url],
                         env={"SERVING_TOKEN": WORKER_TOKEN})


def gauges(service: Service, name: str, endpoint: str) -> dict[tuple[str, str], float]:
    return {(s.labels["version"], s.labels["variable"]): s.value
            for f in text_string_to_metric_families(service.metrics()) for s in f.samples
            if s.name == name and s.labels["endpoint"] == endpoint}


def test_uploaded_reference_drives_drift_from_the_first_window(stats_service: Service, tmp_path: Path) -> None:
    url = stats_service.url
    reference = make_events("upload-e", 1, 300, "reference", 71)
    tokens_file = tmp_path / "tokens.txt"
    tokens_file.write_text("\n".join(str(e["custom"]["tokens"]) for e in reference) + "\n")
    labels = ",".join(e["custom"]["label"] for e in reference)

    res = cli(url, "upload", "--endpoint", "upload-e", "--variable", "tokens", "--file", str(tokens_file))
    assert res.exit_code == 0, res.output
    assert "(scalar): reference of 300 values uploaded" in res.output
    res = cli(url, "upload", "--endpoint", "upload-e", "--variable", "label", "--values", labels)
    assert res.exit_code == 0, res.output
    res = cli(url, "show", "--endpoint", "upload-e", "--variable", "tokens")
    assert res.exit_code == 0 and "300 values, uploaded" in res.output, res.output

    # 60 values only: without the upload they would all go into a learned reference, and no score exist
    run_workers(stats_service.env, [("upload-e", 1, 60, "shifted", 72), ("upload-e", 2, 60, "reference", 73)])
    flags = wait_until(lambda: gauges(stats_service, "serving_drift_detected", "upload-e")
                       if len(gauges(stats_service, "serving_drift_detected", "upload-e")) == 4 else None,
                       what="drift scores of both versions")
    assert flags == {("1", "tokens"): 1.0, ("1", "label"): 1.0, ("2", "tokens"): 0.0, ("2", "label"): 0.0}
    sizes = gauges(stats_service, "serving_drift_reference_size", "upload-e")
    assert set(sizes.values()) == {300.0}

    res = cli(url, "reset", "--endpoint", "upload-e", "--variable", "tokens")
    assert res.exit_code == 0, res.output
    res = cli(url, "show", "--endpoint", "upload-e", "--variable", "tokens")
    assert res.exit_code == 1 and "no stored reference" in res.output


def test_reference_errors_are_clear(stats_service: Service, tmp_path: Path) -> None:
    res = cli(stats_service.url, "upload", "--endpoint", "upload-e", "--variable", "nope", "--values", "1,2,3")
    assert res.exit_code == 1 and "declares no variable 'nope'" in res.output, res.output
    res = cli(stats_service.url, "upload", "--endpoint", "upload-e", "--variable", "tokens", "--values", "1")
    assert res.exit_code == 1 and "at least 2 values" in res.output, res.output
    res = cli(stats_service.url, "upload", "--endpoint", "upload-e", "--variable", "tokens")
    assert res.exit_code == 2 and "exactly one of --file or --values" in res.output
    bad = tmp_path / "bad.json"
    bad.write_text('{"no": 1}')
    res = cli(stats_service.url, "upload", "--endpoint", "upload-e", "--variable", "tokens", "--file", str(bad))
    assert res.exit_code == 2
    res = cli(f"http://127.0.0.1:{free_port()}", "show", "--endpoint", "upload-e", "--variable", "tokens")
    assert res.exit_code == 1 and "cannot reach the statistics service" in res.output

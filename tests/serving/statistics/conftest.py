"""Shared real processes: a fake control plane, the statistics service, Prometheus.

Session-scoped because Prometheus and the service take seconds to start on the
two shared cores; every test uses its own endpoint names so they cannot interfere.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests.serving.statistics.fake_control_plane import FakeControlPlane
from tests.serving.statistics.support import Prometheus, Service, prometheus, statistics_service
from tests.support.procs import wait_until
from tests.serving.statistics.worker_sim import SCALAR_BUCKETS

METRICS = [
    {"name": "tokens", "kind": "scalar", "buckets": SCALAR_BUCKETS},
    {"name": "label", "kind": "enum", "values": ["NEGATIVE", "POSITIVE"]},
    {"name": "score", "kind": "value"},
]
ENDPOINTS = ("count-e", "vars-e", "drift-e", "stable-e", "dash-e", "upload-e", "kafka-e", "worker-e")


def snapshot(revision: int = 1) -> dict:
    return {"revision": revision, "endpoints": {
        name: {"name": name, "engine": "onnxruntime", "targets": [], "metrics": METRICS, "log_freq": 1.0}
        for name in ENDPOINTS}}


@pytest.fixture(scope="session")
def control_plane() -> Iterator[FakeControlPlane]:
    plane = FakeControlPlane(snapshot()).start()
    yield plane
    plane.stop()


@pytest.fixture(scope="session")
def stats_service(tmp_path_factory: pytest.TempPathFactory, control_plane: FakeControlPlane) -> Iterator[Service]:
    home = tmp_path_factory.mktemp("statistics-home")
    with statistics_service(home, control_plane.url) as service:
        wait_until(lambda: service.health()["revision"] == 1, what="service follows the control plane")
        yield service


@pytest.fixture(scope="session")
def prom(tmp_path_factory: pytest.TempPathFactory, stats_service: Service) -> Iterator[Prometheus]:
    workdir: Path = tmp_path_factory.mktemp("prometheus")
    with prometheus(workdir, [f"127.0.0.1:{stats_service.port}"]) as p:
        p.wait_value('up{job="serving-statistics"}', 1.0, timeout=30)
        yield p

"""An in-process worker (FastAPI TestClient) over a real onnxruntime engine: no socket adds anything here."""
from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from registry.artifacts import ArtifactStore
from serving.worker.app import create_app
from tests.serving.worker.support import endpoint_spec, snapshot, worker_settings


class ListRecorder:
    """Collects events as the statistics recorder would receive them."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def record(self, event: dict) -> None:
        self.events.append(event)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    return tmp_path / "home"


@pytest.fixture
def store(home: Path) -> ArtifactStore:
    return ArtifactStore(home / "artifacts")


@pytest.fixture
def make_client(home, store, tmp_path):
    """Start a worker on the given endpoint specs; yields (client, recorder)."""
    clients = []

    def make(*specs: dict, **settings) -> tuple[TestClient, ListRecorder]:
        recorder = ListRecorder()
        app = create_app(worker_settings(home, **settings), snapshot=snapshot(*specs), recorder=recorder)
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client, recorder

    yield make
    for c in clients:
        c.__exit__(None, None, None)


@pytest.fixture
def clf_spec(tiny_model, store, tmp_path):
    return endpoint_spec("clf", tiny_model, store, tmp_path)

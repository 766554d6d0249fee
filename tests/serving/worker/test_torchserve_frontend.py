"""TorchServe's inference API on an in-process worker, over a real handler process: the platform's own
parts on these endpoints (client keys, body limits, bad forms, canary weights, shadow copies, the
statistics event) and the errors in TorchServe's shape. Answers against real TorchServe:
tests/serving/torchserve/test_predictions_e2e.py."""
from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from fastapi.testclient import TestClient

from registry.artifacts import ArtifactStore
from serving.credentials import secret_sha256
from serving.torchserve.archive import read_archive
from serving.worker.app import create_app
from tests.serving.worker.conftest import ListRecorder
from tests.serving.worker.support import snapshot, worker_settings
from tests.support.error_bodies import without_ids

KEY, OTHER = "sk_" + "d" * 64, "sk_" + "e" * 64
HANDLER = '''\
import hashlib


def handle(data, context):
    """Answers what it was handed: the body's length and digest, and the batch size."""
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("data") or row.get("body")
        raw = body if isinstance(body, (bytes, bytearray)) else str(body).encode()
        out.append({"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest(), "batch": len(data)})
    return out
'''


@pytest.fixture(scope="module")
def archive(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("digest-archive")
    (folder / "digest_handler.py").write_text(HANDLER)
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    subprocess.run([str(archiver), "--model-name", "digest", "--version", "1.0", "--handler",
                    str(folder / "digest_handler.py"), "--export-path", str(folder)], check=True, timeout=120)
    return folder / "digest.mar"


def spec(store: ArtifactStore, mar: Path, versions: tuple[tuple[int, float, str], ...]) -> dict[str, Any]:
    sha = store.put_file(mar)[0]
    targets = [{"model": "digest", "version": v, "weight": w, "role": role, "artifact": sha,
                "framework": "torchserve", "signature": read_archive(mar).signature()} for v, w, role in versions]
    return {"name": "digest", "engine": "torchserve", "preprocess": {"kind": "handler"}, "targets": targets,
            "metrics": [], "log_freq": 1.0, "batching": {}, "engine_options": {}}


@pytest.fixture(scope="module")
def worker(tmp_path_factory, archive) -> Iterator[tuple[TestClient, ListRecorder]]:
    """Canary 70/30 over two versions of the archive, a 100% shadow, client keys required, a 64 KiB body cap."""
    home = tmp_path_factory.mktemp("ts-worker")
    store = ArtifactStore(home / "artifacts")
    snap = snapshot(spec(store, archive, ((1, 70.0, "stable"), (2, 30.0, "canary"), (3, 100.0, "shadow"))))
    snap["client_keys"] = {
        "app": {"sha256": secret_sha256(KEY), "endpoints": ["digest"], "rate": None, "burst": None},
        "elsewhere": {"sha256": secret_sha256(OTHER), "endpoints": ["other"], "rate": None, "burst": None},
    }
    recorder = ListRecorder()
    app = create_app(worker_settings(home, client_keys_required=True, max_body_bytes=65536), snapshot=snap,
                     recorder=recorder)
    with TestClient(app) as client:
        client.headers["authorization"] = f"Bearer {KEY}"
        yield client, recorder


def _shape(answer) -> dict:
    body = without_ids(answer)
    assert set(body) == {"code", "type", "message"} and body["code"] == answer.status_code, body
    return body


def test_the_handler_gets_the_bytes_as_sent(worker):
    client, _ = worker
    raw = bytes(range(256)) * 8
    answer = client.put("/predictions/digest", content=raw)
    assert answer.status_code == 200 and answer.headers.get("content-type") is None
    assert answer.json()["sha256"] == hashlib.sha256(raw).hexdigest()
    form = client.post("/predictions/digest", files={"data": ("blob.bin", raw, "application/octet-stream")})
    assert form.json()["sha256"] == hashlib.sha256(raw).hexdigest()


def test_client_keys_on_predictions(worker):
    client, recorder = worker
    missing = client.put("/predictions/digest", content=b"x", headers={"authorization": ""})
    assert missing.status_code == 401 and _shape(missing)["type"] == "InvalidKeyException"
    scoped = client.put("/predictions/digest", content=b"x", headers={"authorization": f"Bearer {OTHER}"})
    assert scoped.status_code == 403 and "digest" in _shape(scoped)["message"]
    assert any(e.get("refused") == "missing_key" for e in recorder.events)


def test_bad_bodies_are_4xx_in_torchserves_shape(worker):
    client, _ = worker
    too_big = client.put("/predictions/digest", content=b"x" * 70000)
    assert too_big.status_code == 413 and "65536" in _shape(too_big)["message"]
    broken = client.post("/predictions/digest", content=b"--x\r\nnonsense",
                         headers={"content-type": "multipart/form-data"})
    assert broken.status_code == 400 and _shape(broken)["type"] == "BadRequestException"
    version = client.put("/predictions/digest/7", content=b"x")
    assert version.status_code == 404 and _shape(version)["type"] == "ModelVersionNotFoundException"


def test_the_canary_takes_its_share(worker):
    """300 requests at 70/30: version 2's count is binomial(300, 0.3), sd 7.9; the bound is 4 sd."""
    client, _ = worker
    versions = [client.put("/predictions/digest", content=b"%d" % i).headers["x-model-version"] for i in range(300)]
    assert set(versions) == {"1", "2"}
    assert abs(versions.count("2") - 90) <= 32, versions.count("2")
    assert client.put("/predictions/digest/2", content=b"pinned").headers["x-model-version"] == "2"


def test_shadow_copies_agree_and_events_carry_the_batch(worker):
    client, recorder = worker
    recorder.events.clear()
    for i in range(5):
        assert client.put("/predictions/digest", content=b"shadowed %d" % i).status_code == 200
    deadline = time.monotonic() + 30  # copies run in the background, after each answer
    while time.monotonic() < deadline and sum(1 for e in recorder.events if e.get("shadow")) < 5:
        time.sleep(0.1)
    shadows = [e for e in recorder.events if e.get("shadow")]
    assert len(shadows) == 5 and all(e["shadow"]["agree"] is True and e["version"] == 3 for e in shadows), shadows
    live = [e for e in recorder.events if not e.get("shadow") and e.get("status") == 200]
    assert live and all(e["torchserve"]["batch"] >= 1 and e["torchserve"]["queue_s"] >= 0 for e in live), live

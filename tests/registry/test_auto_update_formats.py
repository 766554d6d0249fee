"""An auto-update endpoint (``model auto-update``: the newest N versions) follows only versions its
engine can run, by the check ``model add`` applies (registry/formats.py). On the embedded Triton a
TensorRT plan uploaded as the next version is skipped, said in the upload's answer and in the
endpoint's, and the version answering keeps answering; an external Triton runs it, so it is followed."""
from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from registry.api import create_app
from serving.settings import ControlPlaneSettings
from tests.registry.test_api import tiny_onnx
from tests.serving.triton.triton_models import tensorrt_plan
from tests.support.auth import headers


@pytest.fixture(params=[False, True], ids=["embedded", "external"])
def plane(request, tmp_path: Path):
    """A control plane (SQLite: the rule adds no SQL of its own) and whether engine triton is external."""
    repo = tmp_path / "repo" if request.param else None
    with TestClient(create_app(ControlPlaneSettings(home=tmp_path, triton_model_repository=repo))) as c:
        c.headers.update(headers(tmp_path))
        yield c, request.param


def upload(c: TestClient, content: bytes, framework: str) -> dict:
    sha = c.post("/artifacts", content=content).json()["sha256"]
    r = c.post("/models", json={"name": "m", "artifact": sha, "framework": framework})
    assert r.status_code == 201, r.text
    return r.json()


def routes(c: TestClient, name: str = "auto") -> dict[int, float]:
    return {t["version"]: t["weight"] for t in c.get(f"/endpoints/{name}").json()["targets"]}


def test_a_version_the_triton_cannot_run_is_skipped_and_said(plane, tmp_path):
    c, external = plane
    onnx = tiny_onnx(tmp_path / "m.onnx").read_bytes()
    plan = tensorrt_plan(tmp_path / "model.plan").read_bytes()
    assert upload(c, onnx, "onnx")["version"] == 1
    r = c.post("/endpoints", json={"endpoint": "auto", "model": "m", "engine": "triton", "max_versions": 2})
    assert r.status_code == 201 and r.json()["auto_update"]["skipped"] == [], r.text

    answer = upload(c, plan, "tensorrt")  # version 2
    endpoint = c.get("/endpoints/auto").json()
    if external:  # NVIDIA's Triton runs TensorRT plans: followed
        assert "not_followed" not in answer and routes(c) == {1: 0.0, 2: 100.0}
        assert endpoint["auto_update"]["skipped"] == []
        return
    (note,) = answer["not_followed"]
    assert note["endpoint"] == "auto" and "m:2 is a TensorRT plan" in note["reason"]
    assert "SERVING_TRITON_MODEL_REPOSITORY" in note["reason"]  # the way to run it, as at `model add`
    assert routes(c) == {1: 100.0}  # the version answering stays
    assert [s["version"] for s in endpoint["auto_update"]["skipped"]] == [2]
    assert c.get("/config").json()["endpoints"]["auto"]["targets"][0]["version"] == 1

    assert "not_followed" not in upload(c, onnx, "onnx")  # version 3: the newest two it can run
    assert routes(c) == {1: 0.0, 3: 100.0}
    assert [s["version"] for s in c.get("/endpoints/auto").json()["auto_update"]["skipped"]] == [2]


def test_an_onnxruntime_endpoint_skips_what_is_not_onnx(plane, tmp_path):
    """The same one check for every engine: engine onnxruntime runs ONNX only."""
    c, _ = plane
    upload(c, tiny_onnx(tmp_path / "m.onnx").read_bytes(), "onnx")
    assert c.post("/endpoints", json={"endpoint": "ort", "model": "m", "engine": "onnxruntime",
                                      "max_versions": 1}).status_code == 201
    (note,) = upload(c, tensorrt_plan(tmp_path / "model.plan").read_bytes(), "tensorrt")["not_followed"]
    assert note["endpoint"] == "ort" and "engine onnxruntime serves ONNX models" in note["reason"]
    assert routes(c, "ort") == {1: 100.0}

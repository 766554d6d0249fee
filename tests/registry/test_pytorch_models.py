"""The control plane's rules for PyTorch versions (registry/pytorch_models.py), through its API: what an
upload of framework torch-export or pytorch-state-dict must be, which engine a deploy without --engine
gets, what engine torch refuses, and that TorchScript still deploys on an external Triton as before."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient

from registry.api import create_app
from serving.pytorch import archive
from serving.settings import ControlPlaneSettings
from tests.registry.test_api import tiny_onnx
from tests.support.auth import headers

SIGNATURE = {"inputs": [{"name": "x", "dtype": "FP32", "shape": [-1, 4]}],
             "outputs": [{"name": "output__0", "dtype": "FP32", "shape": [-1, 2]}]}
DECLARED = {"inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4]}]}


@pytest.fixture(params=[False, True], ids=["embedded", "external"])
def plane(request, tmp_path: Path):
    """A control plane; with a repository, engine triton is an external Triton (NVIDIA's, every backend)."""
    repo = tmp_path / "repo" if request.param else None
    with TestClient(create_app(ControlPlaneSettings(home=tmp_path / "cp", triton_model_repository=repo))) as c:
        c.headers.update(headers(tmp_path / "cp"))
        yield c, request.param


def post(c: TestClient, content: bytes, framework: str, name: str = "m", signature: dict | None = None):
    sha = c.post("/artifacts", content=content).json()["sha256"]
    return c.post("/models", json={"name": name, "artifact": sha, "framework": framework,
                                   **({"signature": signature} if signature else {})})


def program(tmp_path: Path) -> bytes:
    path = tmp_path / "net.pt2"
    torch.export.save(torch.export.export(torch.nn.Linear(4, 2), (torch.randn(2, 4),)), str(path))
    return path.read_bytes()


def state_dict_archive(tmp_path: Path) -> bytes:
    (tmp_path / "model.py").write_text("import torch\n\nclass Net(torch.nn.Linear):\n"
                                       "    def __init__(self):\n        super().__init__(4, 2)\n")
    torch.save(torch.nn.Linear(4, 2).state_dict(), tmp_path / "weights.pt")
    return archive.pack(tmp_path / "model.py", tmp_path / "weights.pt", "Net")


def torchscript(tmp_path: Path) -> bytes:
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, 2)), str(tmp_path / "net.pt"))
    return (tmp_path / "net.pt").read_bytes()


def test_torch_uploads_are_checked_for_what_they_say_they_are(plane, tmp_path):
    c, _ = plane
    r = post(c, state_dict_archive(tmp_path), "torch-export")
    assert r.status_code == 422 and "takes a .pt2 exported program" in r.text, r.text
    r = post(c, program(tmp_path), "pytorch-state-dict")
    assert r.status_code == 422 and "the archive `serving model upload --path WEIGHTS --model-file" in r.text, r.text
    r = post(c, state_dict_archive(tmp_path), "pytorch-state-dict", signature=SIGNATURE)
    assert r.status_code == 201 and r.json()["signature"] == SIGNATURE, r.text
    assert post(c, program(tmp_path), "torch-export").json()["signature"] == {"inputs": [], "outputs": []}


@pytest.mark.parametrize("framework", ["torch-export", "pytorch-state-dict"])
def test_a_deploy_without_engine_gets_torch(plane, tmp_path, framework):
    c, _ = plane
    content = program(tmp_path) if framework == "torch-export" else state_dict_archive(tmp_path)
    assert post(c, content, framework, signature=SIGNATURE).status_code == 201
    r = c.post("/endpoints", json={"endpoint": "e", "model": "m"})
    assert r.status_code == 201 and r.json()["engine"] == "torch", r.text
    target = c.get("/config").json()["endpoints"]["e"]["targets"][0]
    assert target["framework"] == framework and target["signature"] == SIGNATURE
    r = c.post("/endpoints", json={"endpoint": "t", "model": "m", "engine": "triton"})
    assert r.status_code == 400 and "engine triton serves ONNX models" in r.text, r.text


def test_engine_torch_needs_the_inputs_from_the_signature_or_the_endpoint(plane, tmp_path):
    c, _ = plane
    assert post(c, program(tmp_path), "torch-export").status_code == 201  # through the API, no signature
    r = c.post("/endpoints", json={"endpoint": "e", "model": "m"})
    assert r.status_code == 422 and "uploaded without its inputs" in r.text and "--input-name" in r.text, r.text
    r = c.post("/endpoints", json={"endpoint": "e", "model": "m", "io": DECLARED})
    assert r.status_code == 201 and r.json()["engine"] == "torch", r.text


def test_engine_torch_serves_pytorch_versions_only(plane, tmp_path):
    c, _ = plane
    assert post(c, tiny_onnx(tmp_path / "m.onnx").read_bytes(), "onnx").status_code == 201
    r = c.post("/endpoints", json={"endpoint": "e", "model": "m", "engine": "torch"})
    assert r.status_code == 400 and "engine torch serves PyTorch models" in r.text and "onnxruntime" in r.text


def test_torchscript_goes_to_engine_torch_by_default_and_to_an_external_triton_when_asked(plane, tmp_path):
    """ClearML's --framework pytorch upload of TorchScript is Triton's pytorch_libtorch model, as before:
    with --engine triton an external Triton serves it; the embedded one has no backend for it (422)."""
    c, external = plane
    r = post(c, torchscript(tmp_path), "pytorch")
    assert r.status_code == 201 and r.json()["framework"] == "torchscript", r.text
    r = c.post("/endpoints", json={"endpoint": "e", "model": "m", "io": DECLARED})
    assert r.status_code == 201 and r.json()["engine"] == "torch", r.text
    io = {"inputs": [{"name": "INPUT__0", "dtype": "float32", "shape": [4]}],
          "outputs": [{"name": "OUTPUT__0", "dtype": "float32", "shape": [2]}]}
    r = c.post("/endpoints", json={"endpoint": "t", "model": "m", "engine": "triton", "io": io,
                                   "batching": {"max_batch_size": 8}})
    if external:
        assert r.status_code == 201 and r.json()["engine"] == "triton", r.text
        assert (tmp_path / "repo" / "m_v1" / "1" / "model.pt").exists()
    else:
        assert r.status_code == 422 and "pytorch" in r.text and "SERVING_TRITON_MODEL_REPOSITORY" in r.text, r.text

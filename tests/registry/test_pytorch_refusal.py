"""PyTorch and safetensors files registered as something else are refused with the way to serve them:
by the control plane (a 422 naming what the file is), and by the CLI before it uploads anything. A
checkpoint's way is its model file (`--model-file`, serving/pytorch/); TorchScript and .pt2 files upload
as they are (tests/serving/pytorch/); safetensors files and model folders get the ONNX export
instructions. Real files, written by torch and safetensors themselves."""
from __future__ import annotations

import io
import json
import gzip
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from preprocess.loader import pack_directory
from registry.api import create_app
from registry.signature import pytorch_kind
from serving.cli.main import app
from serving.settings import ControlPlaneSettings
from tests.registry.test_api import tiny_onnx
from tests.support.auth import headers, token
from tests.support.servers import serve_in_thread

INSTRUCTION = ("optimum-cli export onnx", "torch.onnx.export", "--framework custom")


def _net():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 2))


def torch_zip(path: Path) -> Path:
    import torch

    torch.save(_net().state_dict(), path)
    return path


def torch_legacy(path: Path) -> Path:
    import torch

    torch.save(_net().state_dict(), path, _use_new_zipfile_serialization=False)
    return path


def torchscript(path: Path) -> Path:
    import torch

    torch.jit.save(torch.jit.script(_net()), str(path))
    return path


def exported_program(path: Path) -> Path:
    import torch

    torch.export.save(torch.export.export(_net(), (torch.randn(2, 4),)), str(path))
    return path


def safetensors_file(path: Path) -> Path:
    from safetensors.torch import save_file

    save_file(_net().state_dict(), str(path))
    return path


def hf_folder(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    safetensors_file(path / "model.safetensors")
    (path / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    return path


FILES = {
    "pytorch_model.bin": (torch_zip, "a PyTorch checkpoint (torch.save)"),
    "legacy.pth": (torch_legacy, "a PyTorch checkpoint (torch.save)"),
    "model.pt": (torchscript, "a TorchScript archive (torch.jit.save)"),
    "model.pt2": (exported_program, "a PyTorch exported program (torch.export.save)"),
    "model.safetensors": (safetensors_file, "a safetensors file"),
}


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_kind_is_read_from_the_content(tmp_path, name):
    make, kind = FILES[name]
    assert pytorch_kind(make(tmp_path / name)) == kind
    # the name does not matter: the same bytes under another name are recognised alike
    renamed = tmp_path / "model.onnx"
    renamed.write_bytes((tmp_path / name).read_bytes())
    assert pytorch_kind(renamed) == kind


def test_onnx_json_pickles_and_folders_without_weights_are_not_pytorch(tmp_path):
    import joblib
    from sklearn.linear_model import LogisticRegression

    assert pytorch_kind(tiny_onnx(tmp_path / "m.onnx")) is None
    (tmp_path / "xgb.json").write_text(json.dumps({"learner": {}}))
    assert pytorch_kind(tmp_path / "xgb.json") is None
    joblib.dump(LogisticRegression(), tmp_path / "sk.pkl")
    assert pytorch_kind(tmp_path / "sk.pkl") is None
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text("[PAD]\n")
    assert pytorch_kind(tmp_path / "tok") is None
    assert pytorch_kind(hf_folder(tmp_path / "hf")) == "a Hugging Face model folder"


@pytest.fixture
def client(tmp_path: Path):
    home = tmp_path / "cp"
    with TestClient(create_app(ControlPlaneSettings(home=home))) as c:
        c.headers.update(headers(home))
        yield c


# TorchScript uploaded as pytorch is Triton's pytorch_libtorch model: test_torchscript_uploaded_as_pytorch_...
@pytest.mark.parametrize("name,framework", [(n, f) for n in sorted(FILES) for f in (None, "onnx", "pytorch", "sklearn")
                                            if (n, f) != ("model.pt", "pytorch")])
def test_the_api_refuses_them_with_the_export_instructions(client, tmp_path, name, framework):
    make, kind = FILES[name]
    sha = client.post("/artifacts", content=make(tmp_path / name).read_bytes()).json()["sha256"]
    body = {"name": "sentiment", "artifact": sha, **({"framework": framework} if framework else {})}
    r = client.post("/models", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert kind in detail and all(words in detail for words in INSTRUCTION), detail
    assert ("--model-file model.py" in detail) == (kind == "a PyTorch checkpoint (torch.save)"), detail
    if name in ("model.pt", "model.pt2"):  # registered as what they are, they upload (tests/serving/pytorch/)
        assert "serving model upload --path FILE" in detail and "through the API, register it as framework" in detail
    assert client.get("/models").json() == []


def test_torchscript_uploaded_as_pytorch_is_a_triton_model(client, tmp_path):
    """ClearML uploads TorchScript with --framework pytorch for its Triton engine: it is registered as
    the Triton format it is (docs/serving.md, "What a Triton user can bring")."""
    sha = client.post("/artifacts", content=torchscript(tmp_path / "model.pt").read_bytes()).json()["sha256"]
    r = client.post("/models", json={"name": "net", "artifact": sha, "framework": "pytorch"})
    assert r.status_code == 201 and r.json()["framework"] == "torchscript", r.text


def test_the_api_keeps_them_for_user_code_with_framework_custom(client, tmp_path):
    sha = client.post("/artifacts", content=torchscript(tmp_path / "model.pt").read_bytes()).json()["sha256"]
    r = client.post("/models", json={"name": "net", "artifact": sha, "framework": "custom"})
    assert r.status_code == 201, r.text


@pytest.fixture
def cp(tmp_path, monkeypatch):
    home = tmp_path / "cp"
    with serve_in_thread(create_app(ControlPlaneSettings(home=home))) as url:
        monkeypatch.setenv("SERVING_TOKEN", token(home))
        yield url, home


def _words(output: str) -> str:
    """The CLI's error box, unwrapped."""
    return "".join(output.replace("│", " ").split())


def _artifacts(home: Path) -> list[Path]:
    return [p for p in (home / "artifacts").rglob("*") if p.is_file()]


@pytest.mark.parametrize("name", [*sorted(set(FILES) - {"model.pt", "model.pt2"}), "hf-folder"])  # they upload
def test_the_cli_refuses_them_before_uploading(cp, tmp_path, name):
    url, home = cp
    path = hf_folder(tmp_path / name) if name == "hf-folder" else FILES[name][0](tmp_path / name)
    res = CliRunner().invoke(app, ["--control-plane", url, "model", "upload", "--name", "sentiment",
                                   "--path", str(path)], terminal_width=400)
    assert res.exit_code == 2, res.output
    words = _words(res.output)
    kind = "a Hugging Face model folder" if name == "hf-folder" else FILES[name][1]
    assert _words(kind) in words and all(_words(w) in words for w in INSTRUCTION), res.output
    assert (_words("--model-file model.py") in words) == (kind == "a PyTorch checkpoint (torch.save)"), res.output
    assert _artifacts(home) == [], "nothing is uploaded"


def test_the_cli_uploads_one_with_framework_custom(cp, tmp_path):
    url, home = cp
    res = CliRunner().invoke(app, ["--control-plane", url, "model", "upload", "--name", "net", "--framework",
                                   "custom", "--path", str(torchscript(tmp_path / "model.pt"))])
    assert res.exit_code == 0, res.output
    assert "registered net:1" in res.output


def test_a_folder_that_is_no_model_is_refused_as_a_folder(cp, tmp_path):
    url, _ = cp
    (tmp_path / "stuff").mkdir()
    res = CliRunner().invoke(app, ["--control-plane", url, "model", "upload", "--name", "x",
                                   "--path", str(tmp_path / "stuff")], terminal_width=400)
    assert res.exit_code == 2 and _words("stuff is a folder; give the model file") in _words(res.output), res.output


def test_a_tokenizer_folder_packs_without_the_model_weights_beside_it(tmp_path):
    """optimum-cli writes model.onnx next to the tokenizer files; `--tokenizer OUT_DIR` sends only the latter."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("tokenizer.json", "vocab.txt", "config.json"):
        (out / name).write_text(name)
    tiny_onnx(out / "model.onnx")
    safetensors_file(out / "model.safetensors")
    with tarfile.open(fileobj=gzip.GzipFile(fileobj=io.BytesIO(pack_directory(out)))) as tar:
        assert sorted(tar.getnames()) == ["config.json", "tokenizer.json", "vocab.txt"]

"""TorchServe archives at the control plane: read at upload (MANIFEST.json, model-config.yaml), their engine
implied at deploy, requirements.txt refused unless per-model installs are on, wrong combinations refused
with a message; and the CLI's upload and deploy of a .mar as a TorchServe user types them."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from registry.api import create_app
from serving.cli.main import app
from serving.settings import ControlPlaneSettings
from tests.serving.torchserve.archives import build_archives
from tests.support.auth import headers, token
from tests.support.servers import serve_in_thread


@pytest.fixture(scope="module")
def archives(tmp_path_factory):
    return build_archives(tmp_path_factory.mktemp("archives"), ["function", "batched", "requirements"])


def _client(home: Path, **settings) -> TestClient:
    client = TestClient(create_app(ControlPlaneSettings(home=home, torchserve_management_port=0, **settings)))
    client.__enter__()
    client.headers.update(headers(home))
    return client


@pytest.fixture
def client(tmp_path):
    c = _client(tmp_path / "cp")
    yield c
    c.__exit__(None, None, None)


def _upload(client: TestClient, path: Path, framework: str | None = None, name: str = "m"):
    sha = client.post("/artifacts", content=path.read_bytes()).json()["sha256"]
    return client.post("/models", json={"name": name, "artifact": sha, **({"framework": framework} if framework else {})})


@pytest.mark.parametrize("framework", [None, "torchserve", "custom", "pytorch"])
def test_an_archive_is_read_whatever_it_is_called(client, archives, framework):
    answer = _upload(client, archives["batched"].mar, framework)
    assert answer.status_code == 201, answer.text
    model = answer.json()
    info = model["signature"]["torchserve"]
    assert model["framework"] == "torchserve" and info["model_name"] == "batched"
    assert info["config"]["batchSize"] == 4 and info["config"]["maxBatchDelay"] == 200
    assert info["config"]["handler"] == {"scale": 3}  # the handler's own keys are kept whole


def test_the_engine_is_taken_from_the_archive(client, archives):
    _upload(client, archives["function"].mar, name="fn")
    deployed = client.post("/endpoints", json={"endpoint": "fn", "model": "fn"})
    assert deployed.status_code in (200, 201) and deployed.json()["engine"] == "torchserve", deployed.text
    assert deployed.json()["preprocess"]["kind"] == "handler"
    snapshot = client.get("/config").json()["endpoints"]["fn"]
    assert snapshot["engine"] == "torchserve" and snapshot["preprocess"]["kind"] == "handler"
    options = client.post("/endpoints", json={"endpoint": "fn", "model": "fn", "engine": "torchserve",
                                              "aux_config": {"batch_size": "8", "max_batch_delay": "5"}})
    assert options.json()["engine_options"] == {"batch_size": 8, "max_batch_delay": 5}, options.text


@pytest.mark.parametrize("body,status,words", [
    ({"engine": "triton"}, 400, "engine torchserve"),
    ({"engine": "onnxruntime"}, 400, "ONNX"),
    ({"engine": "torchserve", "aux_config": {"batch_size": "lots"}}, 422, "batch_size"),
    ({"engine": "torchserve", "aux_config": {"bogus": "1"}}, 422, "unknown torchserve option"),
    ({"preprocess": {"kind": "user", "artifact": "0" * 64}}, 404, "preprocess artifact"),
])
def test_wrong_combinations_are_refused_with_words(client, archives, body, status, words):
    _upload(client, archives["function"].mar, name="fn")
    answer = client.post("/endpoints", json={"endpoint": "fn", "model": "fn", **body})
    assert answer.status_code == status and words in answer.text, answer.text


def test_the_handler_is_the_preprocessing(client, archives):
    _upload(client, archives["function"].mar, name="fn")
    code = client.post("/artifacts", content=b"class Preprocess:\n    pass\n").json()["sha256"]
    answer = client.post("/endpoints", json={"endpoint": "fn", "model": "fn",
                                             "preprocess": {"kind": "user", "artifact": code}})
    assert answer.status_code == 400 and "does its own preprocessing" in answer.text, answer.text


def test_requirements_are_refused_unless_per_model_installs_are_on(client, archives, tmp_path):
    refused = _upload(client, archives["requirements"].mar)
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert "requirements.txt" in detail and "packaging" in detail and "SERVING_INSTALL_PY_DEP_PER_MODEL" in detail
    allowed = _client(tmp_path / "cp2", install_py_dep_per_model=True)
    try:
        assert _upload(allowed, archives["requirements"].mar).status_code == 201
    finally:
        allowed.__exit__(None, None, None)


def test_a_broken_archive_is_a_422_naming_what_is_wrong(client, tmp_path):
    bad = tmp_path / "bad.mar"
    with zipfile.ZipFile(bad, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "x", "handler": "h.py",
                                                                          "serializedFile": "weights.pt"}}))
    answer = _upload(client, bad)
    assert answer.status_code == 422 and "weights.pt" in answer.json()["detail"], answer.text
    escaping = tmp_path / "escape.mar"
    with zipfile.ZipFile(escaping, "w") as archive:
        archive.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "x", "handler": "h.py",
                                                                          "configFile": "c.yaml"}}))
        archive.writestr("c.yaml", "batchSize: -3\n")
    answer = _upload(client, escaping)
    assert answer.status_code == 422 and "batchSize" in answer.json()["detail"], answer.text


def test_the_cli_uploads_and_deploys_an_archive(tmp_path, archives, monkeypatch):
    home = tmp_path / "cp"
    with serve_in_thread(create_app(ControlPlaneSettings(home=home, torchserve_management_port=0))) as url:
        monkeypatch.setenv("SERVING_TOKEN", token(home))
        runner = CliRunner()
        up = runner.invoke(app, ["--control-plane", url, "model", "upload", "--name", "batched",
                                 "--path", str(archives["batched"].mar)], terminal_width=400)
        assert up.exit_code == 0, up.output
        assert "a TorchServe archive: handler" in up.output and "batch size 4" in up.output, up.output
        add = runner.invoke(app, ["--control-plane", url, "model", "add", "--endpoint", "batched",
                                  "--model", "batched"], terminal_width=400)
        assert add.exit_code == 0 and "(torchserve)" in add.output, add.output

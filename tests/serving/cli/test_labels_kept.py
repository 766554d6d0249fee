"""A canary (or any deploy onto an existing endpoint) added with --tokenizer but without --labels keeps
the endpoint's labels: the postprocess is the endpoint's, so dropping them would rename the stable
version's answers too (LABEL_1 for POSITIVE). Found by running the README's Quick start as written."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from registry.api import create_app
from serving.cli.main import app
from serving.settings import ControlPlaneSettings
from tests.registry.test_api import tiny_onnx
from tests.support.auth import token
from tests.support.servers import serve_in_thread


@pytest.fixture
def cp(tmp_path, monkeypatch):
    with serve_in_thread(create_app(ControlPlaneSettings(home=tmp_path / "cp"))) as url:
        monkeypatch.setenv("SERVING_TOKEN", token(tmp_path / "cp"))
        yield url


def run(cp: str, *args: str):
    res = CliRunner().invoke(app, ["--control-plane", cp, *args], terminal_width=400)
    assert res.exit_code == 0, res.output
    return res.output


def labels(cp: str) -> list[str] | None:
    (ep,) = json.loads(run(cp, "endpoint", "list", "--json"))
    return ep["preprocess"]["options"].get("labels")


def test_a_canary_without_labels_keeps_the_endpoints_labels_and_new_labels_replace_them(cp, tmp_path):
    model = tiny_onnx(tmp_path / "m.onnx")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    for _ in range(2):
        run(cp, "model", "upload", "--name", "sentiment", "--path", str(model))
    run(cp, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:1", "--tokenizer", str(tok),
        "--labels", "NEGATIVE,POSITIVE")
    out = run(cp, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:2", "--tokenizer", str(tok),
              "--canary", "10%")
    assert "keeping the endpoint's labels NEGATIVE,POSITIVE" in out
    assert labels(cp) == ["NEGATIVE", "POSITIVE"]
    run(cp, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:2", "--tokenizer", str(tok),
        "--labels", "BAD,GOOD")
    assert labels(cp) == ["BAD", "GOOD"]


def test_a_new_endpoint_without_labels_has_none(cp, tmp_path):
    run(cp, "model", "upload", "--name", "m", "--path", str(tiny_onnx(tmp_path / "m.onnx")))
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    out = run(cp, "model", "add", "--endpoint", "other", "--model", "m", "--tokenizer", str(tok))
    assert "keeping" not in out
    assert labels(cp) is None

"""The CLI against a real control plane on a loopback socket (CLI itself run in-process)."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from registry.api import create_app
from serving.cli.main import app
from serving.settings import ControlPlaneSettings
from tests.registry.test_api import tiny_onnx
from tests.support.auth import token
from tests.support.procs import free_port
from tests.support.servers import serve_in_thread

runner = CliRunner()


@pytest.fixture
def cp(tmp_path, monkeypatch):
    with serve_in_thread(create_app(ControlPlaneSettings(home=tmp_path / "cp"))) as url:
        monkeypatch.setenv("SERVING_TOKEN", token(tmp_path / "cp"))  # what `serving login` would save
        yield url


def run(cp: str, *args: str):
    return runner.invoke(app, ["--control-plane", cp, *args])


def test_upload_deploy_canary_list(cp, tmp_path):
    path = tiny_onnx(tmp_path / "m.onnx")
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    for _ in range(2):
        res = run(cp, "model", "upload", "--name", "clf", "--path", str(path), "--tag", "demo")
        assert res.exit_code == 0, res.output
    assert "registered clf:2" in res.output
    models = json.loads(run(cp, "model", "list", "--json").output)
    assert [(m["name"], m["version"], m["tags"]) for m in models] == [("clf", 1, ["demo"]), ("clf", 2, ["demo"])]
    res = run(cp, "model", "add", "--endpoint", "e", "--model", "clf:1", "--tokenizer", str(tok), "--labels", "a,b")
    assert res.exit_code == 0 and "clf:1 100%" in res.output
    res = run(cp, "model", "add", "--endpoint", "e", "--model", "clf", "--canary", "10%")
    assert res.exit_code == 0 and "clf:1 90%" in res.output and "clf:2 10%" in res.output
    eps = json.loads(run(cp, "endpoint", "list", "--json").output)
    assert eps[0]["preprocess"]["kind"] == "tokenizer" and eps[0]["preprocess"]["options"]["labels"] == ["a", "b"]
    res = run(cp, "canary", "set", "--endpoint", "e", "--weights", "1=75,2=25")
    assert "clf:2=25%" in res.output
    res = run(cp, "canary", "promote", "--endpoint", "e")
    assert res.exit_code == 0 and "clf:2=100% (stable)" in res.output
    res = run(cp, "metrics", "add", "--endpoint", "e", "--variable-scalar", "tokens=8,16,32",
              "--variable-enum", "label=a,b", "--variable-value", "score", "--log-freq", "0.5")
    assert res.exit_code == 0, res.output
    metrics = json.loads(run(cp, "metrics", "list", "--endpoint", "e", "--json").output)
    assert {m["name"]: m["kind"] for m in metrics} == {"tokens": "scalar", "label": "enum", "score": "value"}
    res = run(cp, "endpoint", "log", "--endpoint", "e", "--sample", "10%", "--field", "inputs", "--field", "outputs",
              "--redact", r"\d{16}")
    assert res.exit_code == 0 and "e: logging 10% of requests (inputs, outputs), redacting 1 pattern(s)" in res.output
    res = run(cp, "endpoint", "log", "--endpoint", "e", "--off")
    assert res.exit_code == 0 and "e: prediction log off" in res.output


@pytest.mark.parametrize("args,message", [
    (["model", "add", "--endpoint", "e", "--model", "ghost"], "model ghost not found"),
    (["model", "add", "--endpoint", "e", "--model", "clf:x"], "model clf:x not found"),  # names may hold colons
    (["model", "add", "--endpoint", "e", "--model", "clf", "--canary", "abc"], "must look like 10%"),
    (["canary", "set", "--endpoint", "e", "--weights", "1:90"], "VERSION=PERCENT"),
    (["canary", "promote", "--endpoint", "nope"], "endpoint nope not found"),
    (["metrics", "add", "--endpoint", "nope", "--variable-scalar", "t=a,b"], "must be numbers"),
    (["endpoint", "log", "--endpoint", "e", "--sample", "ten"], "'ten' must look like 10%"),
    (["endpoint", "log", "--endpoint", "e"], "give either --sample 10% or --off"),
    (["endpoint", "log", "--endpoint", "e", "--sample", "5%", "--field", "passwords"], "unknown field(s) passwords"),
])
def test_errors_are_one_clear_line(cp, args, message):
    res = run(cp, *args)
    assert res.exit_code != 0
    assert message in " ".join(res.output.split())
    assert "Traceback" not in res.output


def test_unreachable_control_plane():
    res = run(f"http://127.0.0.1:{free_port()}", "model", "list")
    assert res.exit_code == 2
    assert "cannot reach the control plane" in res.output

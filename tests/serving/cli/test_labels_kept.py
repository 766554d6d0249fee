"""A canary (or any deploy onto an existing endpoint) added with --tokenizer but without --labels keeps
the endpoint's labels: the postprocess is the endpoint's, so dropping them would rename the stable
version's answers too (LABEL_1 for POSITIVE). Found by running the README's Quick start as written."""
from __future__ import annotations

import json

import pytest

from tests.registry.test_api import tiny_onnx
from tests.serving.cli.test_cli import cp, run  # noqa: F401 (cp: a real control plane on a loopback socket)


def ok(cp: str, *args: str) -> str:
    res = run(cp, *args)
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


@pytest.fixture
def files(tmp_path):
    """A model file and a tokenizer folder to deploy with it."""
    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    return str(tiny_onnx(tmp_path / "m.onnx")), str(tmp_path / "tok")


def labels(cp: str, endpoint: str) -> list[str] | None:
    (ep,) = [e for e in json.loads(run(cp, "endpoint", "list", "--json").output) if e["name"] == endpoint]
    return ep["preprocess"]["options"].get("labels")


def test_a_canary_without_labels_keeps_the_endpoints_labels_and_new_labels_replace_them(cp, files):
    model, tok = files
    ok(cp, "model", "upload", "--name", "sentiment", "--path", model)
    ok(cp, "model", "upload", "--name", "sentiment", "--path", model)
    ok(cp, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:1", "--tokenizer", tok,
       "--labels", "NEGATIVE,POSITIVE")
    out = ok(cp, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:2", "--tokenizer", tok, "--canary", "10%")
    assert "keeping the endpoint's labels NEGATIVE,POSITIVE" in out
    assert labels(cp, "sentiment") == ["NEGATIVE", "POSITIVE"]
    ok(cp, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:2", "--tokenizer", tok, "--labels", "BAD,GOOD")
    assert labels(cp, "sentiment") == ["BAD", "GOOD"]


def test_a_new_endpoint_without_labels_has_none(cp, files):
    model, tok = files
    ok(cp, "model", "upload", "--name", "m", "--path", model)
    assert "keeping" not in ok(cp, "model", "add", "--endpoint", "other", "--model", "m", "--tokenizer", tok)
    assert labels(cp, "other") is None

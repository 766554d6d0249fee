"""What `model add` and `model upload` say besides the routes: what became of --aux-config's
platform/backend (ignored for a model of known format, the model's format for one uploaded without
one), and the versions an auto-update endpoint skips because its engine cannot run them. Against
real control planes on loopback sockets: one writing an external Triton's repository, one whose
engine triton is the embedded Triton."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from registry.api import create_app
from serving.cli.main import app
from serving.settings import ControlPlaneSettings
from tests.registry.test_api import tiny_onnx
from tests.serving.triton.triton_models import tensorrt_plan
from tests.support.auth import token
from tests.support.servers import serve_in_thread


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """``cli(external, *args)``: the CLI's output against the external-Triton or the embedded-Triton plane."""
    root = tmp_path_factory.mktemp("notes")
    with serve_in_thread(create_app(ControlPlaneSettings(home=root / "ext", triton_model_repository=root / "repo"))) \
            as ext, serve_in_thread(create_app(ControlPlaneSettings(home=root / "emb"))) as emb:
        def run(external: bool, *args: str) -> str:
            url, home = (ext, root / "ext") if external else (emb, root / "emb")
            res = CliRunner().invoke(app, ["--control-plane", url, *args], env={"SERVING_TOKEN": token(home)},
                                     terminal_width=400)
            assert res.exit_code == 0, res.output
            return " ".join(res.output.split())
        run.root = root
        yield run


def test_platform_that_names_an_untyped_upload_s_format_is_not_called_ignored(cli):
    """ClearML's huggingface README: `platform="tensorrt_plan"` on a plain file is its format."""
    plan = tensorrt_plan(cli.root / "engine.bin")
    cli(True, "model", "upload", "--name", "hf", "--path", str(plan), "--framework", "custom")
    out = cli(True, "model", "add", "--endpoint", "hf", "--model", "hf", "--engine", "triton", "--aux-config",
              'platform="tensorrt_plan"', "--aux-config", 'default_model_filename="model.bin"')
    assert "--aux-config platform: named the format of the model, uploaded without one: served as a TensorRT " \
           "plan (Triton backend 'tensorrt')" in out, out
    assert "ignored: default_model_filename (" in out, out  # the file name stays ignored


def test_platform_on_a_model_of_known_format_is_ignored(cli):
    onnx = tiny_onnx(cli.root / "m.onnx")
    cli(True, "model", "upload", "--name", "typed", "--path", str(onnx))
    out = cli(True, "model", "add", "--endpoint", "typed", "--model", "typed", "--engine", "triton", "--aux-config",
              'platform="tensorrt_plan"', "--aux-config", 'default_model_filename="model.bin"')
    assert "ignored: platform, default_model_filename" in out and "named the format" not in out, out


def test_a_version_the_embedded_triton_cannot_run_is_reported_not_followed(cli):
    cli(False, "model", "upload", "--name", "auto", "--path", str(tiny_onnx(cli.root / "a.onnx")))
    out = cli(False, "model", "auto-update", "--endpoint", "auto", "--model", "auto", "--engine", "triton",
              "--max-versions", "1")
    assert "auto:1 100%" in out and "skipped" not in out, out
    out = cli(False, "model", "upload", "--name", "auto", "--path", str(tensorrt_plan(cli.root / "model.plan")))
    assert "registered auto:2" in out and "note: endpoint auto does not follow this version: auto:2 is a " \
           "TensorRT plan" in out, out
    out = cli(False, "model", "add", "--endpoint", "auto", "--model", "auto:1", "--engine", "triton",
              "--max-versions", "1")  # auto:2 itself is refused, as at any `model add`
    assert "note: skipped version 2: auto:2 is a TensorRT plan" in out and "auto:1 100%" in out, out

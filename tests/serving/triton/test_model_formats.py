"""Every Triton model format through the platform as a user brings it: `serving model upload` of the
file or model folder, `serving model add` on engine triton, and the control plane writing an external
Triton's repository (``SERVING_TRITON_MODEL_REPOSITORY``): Triton's default layout per format and a
config.pbtxt read back strictly against Triton's protobuf schema.

A real control plane on a socket (in a thread) and the real CLI. TorchScript is made with torch and
checked to load and compute the same from the written repository; the Python-backend model is loaded
and answered by a real tritonserver (the embedded one's binary, pointed at the written repository).
TensorRT, SavedModel and OpenVINO payloads are stand-in bytes (tests/serving/triton/triton_models.py):
no TensorRT, TensorFlow or OpenVINO here, and the writer and its checks never read the model's bytes.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from registry.api import create_app
from serving.cli.main import app
from serving.settings import ControlPlaneSettings
from serving.triton.model_formats import detect
from serving.triton.repository import MARKER, validate_config_pbtxt
from tests.serving.triton.triton_models import (
    openvino_files, run_model_py, savedmodel_dir, shout_alone, shout_folder, tensorrt_plan, torchscript_file,
)
from tests.support.auth import headers, token
from tests.support.servers import serve_in_thread

TORCH_IO = ["--input-name", "INPUT__0", "--input-type", "float32", "--input-size", "4",
            "--output-name", "OUTPUT__0", "--output-type", "float32", "--output-size", "2", "--max-batch-size", "8"]


@pytest.fixture(scope="module")
def external(tmp_path_factory):
    """A control plane that writes an external Triton's repository, and the CLI pointed at it."""
    root = tmp_path_factory.mktemp("formats")
    home, repo = root / "cp", root / "repo"
    settings = ControlPlaneSettings(home=home, triton_model_repository=repo)
    with serve_in_thread(create_app(settings)) as url:
        def cli(*args: str) -> str:
            res = CliRunner().invoke(app, ["--control-plane", url, *args], env={"SERVING_TOKEN": token(home)},
                                     terminal_width=400)
            assert res.exit_code == 0, res.output
            return res.output
        yield cli, repo, root


def deploy(external, name: str, path: Path, *add: str) -> tuple[Path, object]:
    cli, repo, _ = external
    assert f"registered {name}:1" in cli("model", "upload", "--name", name, "--path", str(path))
    cli("model", "add", "--endpoint", name, "--model", name, "--engine", "triton", *add)
    model_dir = repo / f"{name}_v1"
    assert (model_dir / MARKER).exists()
    return model_dir, validate_config_pbtxt((model_dir / "config.pbtxt").read_text())


def files(model_dir: Path) -> list[str]:
    return sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*")
                  if p.is_file() and not p.name.startswith("."))


def test_the_format_is_read_from_the_content_or_the_name(tmp_path):
    assert detect(tensorrt_plan(tmp_path / "model.plan")) == "tensorrt"
    assert detect(torchscript_file(tmp_path / "net.bin")) == "torchscript"  # by content, whatever the name
    assert detect(savedmodel_dir(tmp_path / "model.savedmodel")) == "savedmodel"
    assert detect(openvino_files(tmp_path / "model.xml")) == "openvino"
    folder = shout_folder(tmp_path / "repo")
    assert detect(folder / "1" / "model.py") == "python" and detect(folder) == "folder"
    (tmp_path / "notes.xml").write_text("<notes/>")
    assert detect(tmp_path / "notes.xml") is None


def test_tensorrt_plan(external):
    model_dir, cfg = deploy(external, "trt", tensorrt_plan(external[2] / "model.plan"))
    assert files(model_dir) == ["1/model.plan", "config.pbtxt"]
    assert (cfg.name, cfg.platform, cfg.backend) == ("trt_v1", "tensorrt_plan", "tensorrt")
    assert cfg.max_batch_size == 32 and not cfg.input  # Triton reads a plan's tensors itself


def test_torchscript_with_declared_tensors_loads_and_computes_alike(external):
    import torch

    original = torchscript_file(external[2] / "model.pt")
    model_dir, cfg = deploy(external, "ts", original, *TORCH_IO)
    assert files(model_dir) == ["1/model.pt", "config.pbtxt"]
    assert (cfg.platform, cfg.backend, cfg.max_batch_size) == ("pytorch_libtorch", "pytorch", 8)
    assert [(t.name, list(t.dims)) for t in [*cfg.input, *cfg.output]] == [("INPUT__0", [4]), ("OUTPUT__0", [2])]
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4)
    np.testing.assert_array_equal(torch.jit.load(str(model_dir / "1" / "model.pt"))(x).detach().numpy(),
                                  torch.jit.load(str(original))(x).detach().numpy())


def test_savedmodel_folder(external):
    model_dir, cfg = deploy(external, "tf", savedmodel_dir(external[2] / "model.savedmodel"))
    assert files(model_dir) == ["1/model.savedmodel/saved_model.pb",
                                "1/model.savedmodel/variables/variables.index", "config.pbtxt"]
    assert (cfg.platform, cfg.backend) == ("tensorflow_savedmodel", "tensorflow")


def test_openvino_xml_with_its_bin(external):
    (external[2] / "ov").mkdir()
    model_dir, cfg = deploy(external, "ov", openvino_files(external[2] / "ov" / "weights.xml"))
    assert files(model_dir) == ["1/model.bin", "1/model.xml", "config.pbtxt"]  # Triton's default names
    assert (cfg.platform, cfg.backend) == ("", "openvino")


def test_a_model_folder_keeps_its_own_config_under_its_triton_name(external):
    """A TensorRT model folder as in a Triton repository (version 3, batched dims, a label file): its
    newest version becomes version 1, its config.pbtxt is kept (renamed, --aux-config fields merged),
    and its tensors are the registry's signature, batch dimension included."""
    folder = external[2] / "resnet"
    for version in ("2", "3"):
        (folder / version).mkdir(parents=True)
        tensorrt_plan(folder / version / "model.plan").write_bytes(f"plan of version {version}".encode())
    (folder / "labels.txt").write_text("cat\ndog\n")
    (folder / "config.pbtxt").write_text(
        'name: "resnet"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'
        'input [{ name: "input" data_type: TYPE_FP16 dims: [3, 224, 224] }]\n'
        'output [{ name: "probs" data_type: TYPE_FP16 dims: [2] label_filename: "labels.txt" }]\n')
    model_dir, cfg = deploy(external, "resnet", folder, "--aux-config", "response_cache.enable=true")
    assert files(model_dir) == ["1/model.plan", "config.pbtxt", "labels.txt"]
    assert (model_dir / "1" / "model.plan").read_bytes() == b"plan of version 3"  # the newest
    assert (cfg.name, cfg.platform, cfg.max_batch_size, cfg.response_cache.enable) == ("resnet_v1", "tensorrt_plan",
                                                                                        8, True)
    assert cfg.output[0].label_filename == "labels.txt"
    (model,) = [m for m in json.loads(external[0]("model", "list", "--json")) if m["name"] == "resnet"]
    assert model["framework"] == "tensorrt"
    assert model["signature"] == {"inputs": [{"name": "input", "dtype": "FP16", "shape": [-1, 3, 224, 224]}],
                                  "outputs": [{"name": "probs", "dtype": "FP16", "shape": [-1, 2]}],
                                  "max_batch_size": 8}


def test_an_onnx_model_folder_uploads_its_onnx_file(external):
    """The platform writes an ONNX model's config.pbtxt itself (the endpoint's batching): the folder's
    ONNX file is uploaded as any ONNX model, signature read from the graph."""
    from tests.registry.test_api import tiny_onnx

    folder = external[2] / "onnx-folder"
    (folder / "1").mkdir(parents=True)
    onnx_path = tiny_onnx(folder / "1" / "model.onnx")
    (folder / "config.pbtxt").write_text('name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 4\n')
    model_dir, cfg = deploy(external, "onnxf", folder)
    assert files(model_dir) == ["1/model.onnx", "config.pbtxt"]
    assert (model_dir / "1" / "model.onnx").read_bytes() == onnx_path.read_bytes()
    assert (cfg.platform, cfg.max_batch_size) == ("onnxruntime_onnx", 32) and cfg.input


def test_aux_config_platform_names_the_format_of_an_untyped_upload(external):
    """ClearML's huggingface README: `--aux-config platform="tensorrt_plan"` on a model uploaded as a
    plain file (here --framework custom): written as a TensorRT plan."""
    cli, repo, root = external
    path = tensorrt_plan(root / "engine.bin")
    assert "registered hf:1" in cli("model", "upload", "--name", "hf", "--path", str(path), "--framework", "custom")
    cli("model", "add", "--endpoint", "hf", "--model", "hf", "--engine", "triton", "--aux-config",
        'platform="tensorrt_plan"')
    cfg = validate_config_pbtxt((repo / "hf_v1" / "config.pbtxt").read_text())
    assert files(repo / "hf_v1") == ["1/model.plan", "config.pbtxt"] and cfg.platform == "tensorrt_plan"


def test_a_python_model_from_the_external_repository_runs_on_a_real_tritonserver(external, tmp_path):
    from serving.triton.embedded import fix_library_path
    from serving.triton.python_backend import ACCESS_HEADER, control_call, remove_shm, server_command, start_server
    from serving.supervisor import stop_process
    from tests.support.procs import free_port, wait_http
    import tritonclient.http as httpclient

    _, repo, root = external
    model_dir, cfg = deploy(external, "py", shout_folder(root / "pyrepo", suffix="!"))
    assert files(model_dir) == ["1/model.py", "config.pbtxt"]
    assert (cfg.name, cfg.backend, cfg.parameters["suffix"].string_value) == ("py_v1", "python", "!")
    fix_library_path()
    http, grpc, metrics = free_port(), free_port(), free_port()
    command = server_command(tmp_path, repo, "127.0.0.1", http, grpc, metrics)
    server = start_server(command)
    try:
        wait_http(f"http://127.0.0.1:{http}/v2/health/live", timeout=60, proc=server)
        control_call(f"127.0.0.1:{http}", {ACCESS_HEADER: command.token}, 120.0, "load_model", "py_v1")
        client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        text = httpclient.InferInput("TEXT", [2], "BYTES")
        text.set_data_from_numpy(np.array(["naïve".encode(), b"ok"], dtype=np.object_))
        result = client.infer("py_v1", [text])
        client.close()
    finally:
        stop_process(server, 6.0)
        remove_shm(command.shm_prefix)
    want = run_model_py(root / "pyrepo" / "shout", ["naïve", "ok"], "!")
    assert result.as_numpy("UPPER").tolist() == want["UPPER"].tolist() == ["NAÏVE!".encode(), b"OK!"]
    assert result.as_numpy("LENGTH").tolist() == want["LENGTH"].tolist()


# --- the API's checks -------------------------------------------------------------------------------
@pytest.fixture
def api(tmp_path):
    def client(external: bool) -> TestClient:
        home = tmp_path / f"cp-{external}"
        settings = ControlPlaneSettings(home=home, triton_model_repository=tmp_path / "repo" if external else None)
        c = TestClient(create_app(settings))
        c.__enter__()
        c.headers.update(headers(home))
        opened.append(c)
        return c

    opened: list[TestClient] = []
    yield client
    for c in opened:
        c.__exit__(None, None, None)


def upload(c: TestClient, name: str, content: bytes, framework: str):
    sha = c.post("/artifacts", content=content).json()["sha256"]
    return c.post("/models", json={"name": name, "artifact": sha, "framework": framework})


def test_embedded_or_external_decides_what_engine_triton_takes(api, tmp_path):
    plan = tensorrt_plan(tmp_path / "model.plan").read_bytes()
    model_py = shout_alone(tmp_path / "r", auto_complete=True).read_bytes()  # alone: it declares its tensors
    embedded, full = api(False), api(True)
    for c in (embedded, full):
        assert upload(c, "trt", plan, "tensorrt").status_code == 201
        assert upload(c, "py", model_py, "python").status_code == 201
        assert c.post("/endpoints", json={"endpoint": "py", "model": "py"}).status_code == 201
    r = embedded.post("/endpoints", json={"endpoint": "trt", "model": "trt"})
    assert r.status_code == 422 and "a TensorRT plan" in r.json()["detail"], r.text
    assert full.post("/endpoints", json={"endpoint": "trt", "model": "trt"}).status_code == 201
    r = embedded.post("/endpoints", json={"endpoint": "trt", "model": "trt", "engine": "onnxruntime"})
    assert r.status_code == 400 and "engine onnxruntime serves ONNX models" in r.text


@pytest.mark.parametrize("framework,content,words", [
    ("python", b"print('hello')\n", "class TritonPythonModel"),
    ("torchscript", b"not a zip", "not a TorchScript archive"),
    ("savedmodel", b"\x08\x01", "upload its folder"),
    ("tensorrt", b"", "empty"),
])
def test_an_upload_that_is_not_its_format_is_a_422(api, framework, content, words):
    r = upload(api(False), "m", content, framework)
    assert r.status_code == 422 and words in r.json()["detail"], r.text


def test_a_folder_whose_config_pbtxt_triton_would_refuse_is_a_422(api, tmp_path):
    from serving.triton.model_folder import pack
    from serving.triton.model_formats import FORMATS

    folder = shout_folder(tmp_path / "r")
    (folder / "config.pbtxt").write_text('name: "shout" backend: "python" max_batch_sise: 4\n')
    r = upload(api(False), "m", pack(folder, FORMATS["python"]), "python")
    assert r.status_code == 422 and "max_batch_sise" in r.json()["detail"], r.text
    (folder / "config.pbtxt").write_text('name: "shout" backend: "python"\n')
    (folder / "1" / "model.py").unlink()
    (folder / "1" / "other.py").write_text("x = 1\n")
    r = upload(api(False), "m", pack(folder, FORMATS["python"]), "python")
    assert r.status_code == 422 and "needs 1/model.py" in r.json()["detail"], r.text


def test_declared_tensors_are_checked_against_the_config_pbtxt(api, tmp_path):
    """Shapes as the model's own config.pbtxt means them (max_batch_size 0 there: whole shapes, whatever
    the endpoint's --max-batch-size), names and dtypes as for an ONNX signature."""
    from serving.triton.model_folder import pack
    from serving.triton.model_formats import FORMATS

    c = api(False)
    assert upload(c, "shout", pack(shout_folder(tmp_path / "r"), FORMATS["python"]), "python").status_code == 201
    body = {"endpoint": "shout", "model": "shout", "batching": {"max_batch_size": 16}}
    io = {"inputs": [{"name": "TEXT", "dtype": "BYTES", "shape": [-1]}]}
    r = c.post("/endpoints", json={**body, "io": io})
    assert r.status_code == 201 and r.json()["io"]["inputs"] == [{"name": "TEXT", "dtype": "BYTES", "shape": [-1]}]
    r = c.post("/endpoints", json={**body, "io": {"inputs": [{"name": "text", "dtype": "BYTES"}]}})
    assert r.status_code == 422 and "'text' is not an input of shout:1" in r.text, r.text
    r = c.post("/endpoints", json={**body, "io": {"inputs": [{"name": "TEXT", "dtype": "BYTES", "shape": [-1, 3]}]}})
    assert r.status_code == 422 and "shape [-1, 3]" in r.text, r.text

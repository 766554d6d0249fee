"""LLM model versions and `--engine vllm` endpoints in the registry: a Hugging Face folder uploaded as one
content-addressed version, engine options from ClearML's --aux-config checked with a 422 naming the option,
versions vLLM cannot serve refused before they are served, migration 0005 on SQLite and PostgreSQL."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from registry.api import create_app
from serving.cli.clearml_flags import expand_variadic
from serving.cli.main import app
from serving.settings import ControlPlaneSettings
from tests.registry.test_pytorch_refusal import cp  # noqa: F401 (a control plane on a socket, the CLI's token)
from tests.support.auth import headers

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "num_attention_heads": 2,
         "head_dim": 32, "max_position_embeddings": 512, "vocab_size": 16}


def llm_folder(path: Path, config: dict | None = None, tokenizer: bool = True) -> Path:
    """A folder laid out as save_pretrained writes it (the checks read config.json and the file names);
    the engine tests use serving/testmodels_llm's real tiny Llama."""
    from safetensors.numpy import save_file
    import numpy as np

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(LLAMA if config is None else config))
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(path / "model.safetensors"))
    (path / "generation_config.json").write_text("{}")
    if tokenizer:
        (path / "tokenizer.json").write_text('{"version": "1.0"}')
        (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    (path / ".built").write_text("a builder's stamp: hidden files stay out")
    return path


def cli(url: str, *args: str, code: int = 0):
    res = CliRunner().invoke(app, ["--control-plane", url, *expand_variadic(list(args))], terminal_width=400)
    assert res.exit_code == code, res.output
    return res


def test_a_folder_is_one_content_addressed_version_with_its_facts(cp, tmp_path):  # noqa: F811
    url, home = cp
    folder = llm_folder(tmp_path / "my-llm")
    res = cli(url, "model", "upload", "--name", "my llm", "--path", str(folder))
    assert "registered my llm:1" in res.output and "uploading my-llm/ (5 files)" in res.output, res.output
    cli(url, "model", "upload", "--name", "my llm", "--path", str(folder))
    with TestClient(create_app(ControlPlaneSettings(home=home)), headers=headers(home)) as c:
        v1, v2 = c.get("/models").json()
    assert v1["framework"] == "hf-causal-lm" and v1["sha256"] == v2["sha256"], "same files, same artifact"
    assert v1["signature"] == {"llm": {
        "max_model_len": 512, "architectures": ["LlamaForCausalLM"], "chat_template": True, "model_type": "llama",
        "head_size": 32, "tokenizer_files": ["tokenizer.json"], "weight_files": 1}}
    stored = home / "artifacts" / v1["sha256"][:2] / v1["sha256"]
    assert stored.stat().st_size == v1["size"]
    with tarfile.open(stored) as tar:
        names = sorted(m.name for m in tar.getmembers())
        assert names == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                         "tokenizer_config.json"]
        assert all(tar.extractfile(n).read() == (folder / n).read_bytes() for n in names)


def test_an_encoder_folder_keeps_the_onnx_advice(cp, tmp_path):  # noqa: F811
    url, home = cp
    folder = llm_folder(tmp_path / "bert", {**LLAMA, "architectures": ["BertForSequenceClassification"]})
    res = cli(url, "model", "upload", "--name", "bert", "--path", str(folder), code=2)
    assert "optimum-cli" in res.output
    assert not [p for p in (home / "artifacts").rglob("*") if p.is_file()]


@pytest.fixture
def client(tmp_path):
    home = tmp_path / "cp"
    with TestClient(create_app(ControlPlaneSettings(home=home)), headers=headers(home)) as c:
        yield c


def register(client: TestClient, tmp_path: Path, name: str, **folder_kw) -> None:
    from serving.llm.folder import archive_folder

    archive = archive_folder(llm_folder(tmp_path / name, **folder_kw))
    sha = client.post("/artifacts", content=b"".join(archive.chunks())).json()["sha256"]
    r = client.post("/models", json={"name": name, "artifact": sha, "framework": "hf-causal-lm"})
    assert r.status_code == 201, r.text


def test_aux_config_is_the_engine_options_in_the_snapshot(client, tmp_path):
    register(client, tmp_path, "llm")
    aux = {"dtype": "float32", "max-model-len": "256", "kv_cache_space_gb": "1.5",
           "extra_args": '"--enforce-eager --seed 1"'}
    r = client.post("/endpoints", json={"endpoint": "chat", "model": "llm", "engine": "vllm", "aux_config": aux})
    assert r.status_code == 201, r.text
    options = {"dtype": "float32", "max_model_len": 256, "kv_cache_space_gb": 1.5,
               "extra_args": ["--enforce-eager", "--seed", "1"]}
    assert r.json()["engine_options"] == options
    snap = client.get("/config").json()["endpoints"]["chat"]
    assert snap["engine"] == "vllm" and snap["engine_options"] == options
    assert snap["targets"][0]["framework"] == "hf-causal-lm" and snap["targets"][0]["signature"]["llm"]["head_size"] == 32
    # a canary without options keeps the endpoint's; another engine drops them
    register(client, tmp_path, "llm2")
    assert client.post("/endpoints", json={"endpoint": "chat", "model": "llm2", "engine": "vllm",
                                           "canary": 10}).json()["engine_options"] == options
    external = {"url": "http://gpu-box:8000/v1/", "served_model_name": "llama"}
    r = client.post("/endpoints", json={"endpoint": "ext", "model": "llm", "engine": "vllm", "engine_options": external})
    assert r.json()["engine_options"] == {"url": "http://gpu-box:8000/v1", "served_model_name": "llama"}
    assert client.get("/config").json()["endpoints"]["ext"]["engine_options"]["url"] == "http://gpu-box:8000/v1"
    several = {"url": "http://a:8000/v1/, http://b:8000/v1", "routing": "session"}  # an engine per URL
    r = client.post("/endpoints", json={"endpoint": "ext2", "model": "llm", "engine": "vllm", "engine_options": several})
    assert r.json()["engine_options"] == {"url": "http://a:8000/v1,http://b:8000/v1", "routing": "session"}, r.text
    r = client.post("/endpoints", json={"endpoint": "ext3", "model": "llm", "engine": "vllm",
                                        "engine_options": {"url": "http://a:8000/v1", "replicas": 2}})
    assert r.status_code == 422 and "replicas: set where the external engine" in r.text, r.text


@pytest.mark.parametrize("pair, named", [
    (("dtype", "float64"), "dtype"), (("max_model_len", "0"), "max_model_len"),
    (("max_model_len", "long"), "max_model_len"), (("gpu_memory_utilization", "1.5"), "gpu_memory_utilization"),
    (("tensor_parallel_size", "0"), "tensor_parallel_size"), (("kv_cache_space_gb", "-1"), "kv_cache_space_gb"),
    (("url", "ftp://host/v1"), "url"), (("url", "http://host:8000"), "url"), (("temperature", "1"), "temperature"),
    (("extra_args", "--port 9"), "--port is set by the platform"),
    (("extra_args", "--max-model-len=9"), "use the option max_model_len"),
    (("served_model_name", "x"), "served_model_name"),
    (("routing", "random"), "'random' is not a routing policy; known: least-loaded, session, prefix, round-robin"),
    (("replicas", "0"), "replicas"), (("url", "http://a:8000/v1,http://b:8000"), "'http://b:8000' must be"),
])
def test_a_bad_engine_option_is_a_422_naming_it(client, tmp_path, pair, named):
    register(client, tmp_path, "llm")
    r = client.post("/endpoints", json={"endpoint": "chat", "model": "llm", "engine": "vllm",
                                        "aux_config": dict([pair])})
    assert r.status_code == 422, r.text
    assert named in json.dumps(r.json()["detail"]), r.text


def test_options_an_external_engine_sets_itself_and_options_of_other_engines_are_refused(client, tmp_path):
    register(client, tmp_path, "llm")
    r = client.post("/endpoints", json={"endpoint": "e", "model": "llm", "engine": "vllm",
                                        "engine_options": {"url": "https://h/v1", "dtype": "float16"}})
    assert r.status_code == 422 and "dtype: set where the external engine" in r.text, r.text
    r = client.post("/endpoints", json={"endpoint": "e", "model": "llm", "engine": "onnxruntime",
                                        "engine_options": {"dtype": "float16"}})
    assert r.status_code == 422 and "engine_options are for engine vllm" in r.text, r.text


@pytest.mark.parametrize("config, folder_kw, options, words", [
    ({**LLAMA, "architectures": ["BertForMaskedLM"]}, {}, {}, "not a causal language model"),
    (LLAMA, {"tokenizer": False}, {}, "has no tokenizer files"),
    ({**LLAMA, "head_dim": 24}, {}, {}, "head size 24 is not one vLLM's CPU attention takes"),
    ({**LLAMA, "head_dim": None, "hidden_size": 40, "num_attention_heads": 2}, {}, {},
     "head size 20 is not one vLLM's CPU attention takes"),
    (LLAMA, {}, {"max_model_len": 1024}, "max_model_len 1024 is past bad:1's max_position_embeddings (512)"),
])
def test_what_vllm_cannot_serve_is_a_422_naming_what_is_wrong(client, tmp_path, config, folder_kw, options, words):
    register(client, tmp_path, "bad", config=config, **folder_kw)
    r = client.post("/endpoints", json={"endpoint": "chat", "model": "bad", "engine": "vllm", "engine_options": options})
    assert r.status_code == 422 and words in r.json()["detail"], r.text
    assert client.get("/endpoints").json() == []


def test_head_sizes_differ_on_gpu_and_non_folders_are_refused(client, tmp_path):
    register(client, tmp_path, "h24", config={**LLAMA, "head_dim": 24})
    external = {"url": "http://gpu:8000/v1"}  # a GPU engine: FlashAttention takes multiples of 8
    assert client.post("/endpoints", json={"endpoint": "e", "model": "h24", "engine": "vllm",
                                           "engine_options": external}).status_code == 201
    sha = client.post("/artifacts", content=b"not a folder").json()["sha256"]
    r = client.post("/models", json={"name": "x", "artifact": sha, "framework": "hf-causal-lm"})
    assert r.status_code == 422 and "serving model upload --path FOLDER" in r.text, r.text
    sha = client.post("/artifacts", content=b"some model").json()["sha256"]
    client.post("/models", json={"name": "c", "artifact": sha, "framework": "custom"})
    r = client.post("/endpoints", json={"endpoint": "e2", "model": "c", "engine": "vllm"})
    assert r.status_code == 422 and "no Hugging Face model folder" in r.text, r.text


def test_migration_0005_on_sqlite_and_postgresql(database_url, tmp_path):
    """Endpoints made before 0005 get {} options; the column round-trips and 0005 downgrades."""
    from alembic import command
    from sqlalchemy import text

    from registry.db import make_engine, migrations

    engine = make_engine(database_url)
    with migrations(engine) as (conn, cfg):
        command.upgrade(cfg, "0004")
        conn.execute(text("INSERT INTO endpoints (name, engine, preprocess, batching, log_freq, io, auto_update, "
                          "created_at) VALUES ('old', 'triton', '{}', '{}', 1.0, '{}', '{}', CURRENT_TIMESTAMP)"))
        command.upgrade(cfg, "0005")
        assert conn.execute(text("SELECT engine_options FROM endpoints")).scalar() in ({}, "{}")
        command.downgrade(cfg, "0004")  # and back, before any other connection holds the table
        command.upgrade(cfg, "head")
    engine.dispose()
    home = tmp_path / "home"
    with TestClient(create_app(ControlPlaneSettings(home=home, database_url=database_url)),
                    headers=headers(home)) as c:
        assert c.get("/config").json()["endpoints"]["old"]["engine_options"] == {}
        register(c, tmp_path, "llm")
        r = c.post("/endpoints", json={"endpoint": "chat", "model": "llm", "engine": "vllm",
                                       "aux_config": {"max_model_len": "128"}})
        assert r.status_code == 201, r.text
        assert c.get("/endpoints/chat").json()["engine_options"] == {"max_model_len": 128}


def test_clearml_vllm_commands_as_typed(cp, tmp_path):  # noqa: F811
    """examples/vllm's three commands, `serving` for `clearml-serving --id <service_id>`, the uploaded folder for
    <model_id> (found by --name and --project); auto-update serves the two newest versions, canary splits them."""
    url, home = cp
    folder = llm_folder(tmp_path / "llm")
    cli(url, "model", "upload", "--name", "test vllm", "--project", "serving examples", "--path", str(folder))
    pre = tmp_path / "preprocess.py"
    pre.write_text("class Preprocess:\n    def preprocess(self, body, state, collect_custom_statistics_fn=None):\n"
                   "        return body\n")
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "test_vllm", "--preprocess", str(pre),
        "--name", "test vllm", "--project", "serving examples")
    cli(url, "model", "auto-update", "--engine", "vllm", "--endpoint", "test_vllm", "--preprocess", str(pre),
        "--name", "test vllm", "--project", "serving examples", "--max-versions", "2")
    cli(url, "model", "upload", "--name", "test vllm", "--project", "serving examples", "--path", str(folder))
    res = cli(url, "model", "canary", "--endpoint", "test_vllm", "--weights", "0.1", "0.9",
              "--input-endpoint-prefix", "test_vllm")
    assert "test vllm:1=10%, test vllm:2=90%" in res.output, res.output
    with TestClient(create_app(ControlPlaneSettings(home=home)), headers=headers(home)) as c:
        ep = c.get("/config").json()["endpoints"]["test_vllm"]
    assert ep["engine"] == "vllm" and ep["preprocess"]["kind"] == "user"
    assert [(t["model"], t["version"], t["weight"]) for t in ep["targets"]] == [("test vllm", 1, 10.0),
                                                                              ("test vllm", 2, 90.0)]


def test_a_new_version_an_auto_update_vllm_endpoint_would_serve_is_checked_at_upload(client, tmp_path):
    register(client, tmp_path, "llm")
    r = client.post("/endpoints", json={"endpoint": "chat", "model": "llm", "engine": "vllm", "max_versions": 2})
    assert r.status_code == 201, r.text
    from serving.llm.folder import archive_folder

    bad = archive_folder(llm_folder(tmp_path / "h24", {**LLAMA, "head_dim": 24}))
    sha = client.post("/artifacts", content=b"".join(bad.chunks())).json()["sha256"]
    r = client.post("/models", json={"name": "llm", "artifact": sha, "framework": "hf-causal-lm"})
    assert r.status_code == 422, r.text
    assert "(endpoint chat follows its newest versions)" in r.text and "head size 24" in r.text, r.text
    assert [m["version"] for m in client.get("/models").json()] == [1]

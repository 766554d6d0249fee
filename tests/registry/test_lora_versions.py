"""LoRA adapters as model versions in the registry: `serving model upload --path ADAPTER --base NAME:VERSION`
stores a PEFT folder as a version that knows its base, checked tensor by tensor against the base's weights;
deploying it is checked against the engine's options; it runs in its base's engine
(tests/serving/llm/test_lora_e2e.py serves one on real vLLM)."""
from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from registry.api import create_app
from serving.llm.launch.process import vllm_command, wanted_engines
from serving.llm.naming import engine_key
from serving.settings import ControlPlaneSettings
from serving.testmodels_llm import build_lora_adapter, build_tiny_llama
from tests.registry.test_llm_models import cli
from tests.registry.test_pytorch_refusal import _words, cp  # noqa: F401 (a control plane on a socket)
from tests.support.auth import headers


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-models")
    base = build_tiny_llama(root / "tiny").path
    return {"base": base, "adapter": build_lora_adapter(root / "adapter", base),
            "rank16": build_lora_adapter(root / "rank16", base, rank=16),
            "mlp": build_lora_adapter(root / "mlp", base, modules=("gate_proj",))}


def control(home) -> TestClient:
    return TestClient(create_app(ControlPlaneSettings(home=home)), headers=headers(home))


def test_an_adapter_is_a_version_that_knows_its_base(cp, models):  # noqa: F811
    url, home = cp
    cli(url, "model", "upload", "--name", "tiny-llm", "--path", str(models["base"]))
    res = cli(url, "model", "upload", "--name", "support-bot", "--path", str(models["adapter"]), "--base", "tiny-llm:1")
    assert _words("registered support-bot:1") in _words(res.output)
    assert _words("a LoRA adapter of tiny-llm:1 (rank 8 on q_proj, v_proj)") in _words(res.output), res.output
    with control(home) as c:
        found = {m["name"]: m for m in c.get("/models").json()}
    base, adapter = found["tiny-llm"], found["support-bot"]
    assert adapter["framework"] == "hf-lora"
    assert adapter["signature"]["lora"] == {
        "base": {"name": "tiny-llm", "version": 1, "artifact": base["sha256"]}, "rank": 8, "alpha": 16,
        "target_modules": ["q_proj", "v_proj"]}
    assert adapter["signature"]["llm"] == base["signature"]["llm"], "the base's context and chat template"


def changed(models, tmp_path, edit) -> str:
    """The adapter, one of its tensors edited as trained on another model."""
    from safetensors.torch import load_file, save_file

    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "adapter_config.json").write_text((models["adapter"] / "adapter_config.json").read_text())
    tensors = load_file(str(models["adapter"] / "adapter_model.safetensors"))
    edit(tensors, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight")
    save_file(tensors, str(odd / "adapter_model.safetensors"))
    return str(odd)


def smaller(tensors, name) -> None:  # trained on a hidden size of 32
    tensors[name] = tensors[name][:, :32].contiguous()


def deeper(tensors, name) -> None:  # a model with a third layer
    for part in (name, name.replace("lora_A", "lora_B")):
        tensors[part.replace("layers.0", "layers.2")] = tensors[part].clone()


def other_architecture(tensors, name) -> None:  # GPT-2's module names
    for part in (name, name.replace("lora_A", "lora_B")):
        tensors[part.replace("model.layers.0.self_attn.q_proj", "transformer.h.0.attn.c_attn")] = tensors.pop(part)


@pytest.mark.parametrize("edit, words", [
    (smaller, "the adapter's model.layers.0.self_attn.q_proj is sized for another model: lora_A [8, 32] and "
              "lora_B [64, 8] do not fit the base's weight [64, 64]"),
    (deeper, "the adapter adapts model.layers.2.self_attn.q_proj, which the base model does not have"),
    (other_architecture, "the adapter adapts transformer.h.0.attn.c_attn, which the base model does not have"),
])
def test_an_adapter_that_does_not_fit_its_base_is_refused_naming_why(cp, models, tmp_path, edit, words):  # noqa: F811
    url, _ = cp
    cli(url, "model", "upload", "--name", "tiny-llm", "--path", str(models["base"]))
    res = cli(url, "model", "upload", "--name", "bot", "--path", changed(models, tmp_path, edit), "--base",
              "tiny-llm:1", code=1)
    assert _words(words) in _words(res.output), res.output
    with control(cp[1]) as c:
        assert [m["name"] for m in c.get("/models").json()] == ["tiny-llm"], "nothing registered"


def test_an_adapter_needs_a_base_that_is_there(cp, models):  # noqa: F811
    url, _ = cp
    res = cli(url, "model", "upload", "--name", "bot", "--path", str(models["adapter"]), code=2)
    assert _words("is a LoRA adapter: give the version it was trained on with --base") in _words(res.output)
    res = cli(url, "model", "upload", "--name", "bot", "--path", str(models["adapter"]), "--base", "missing:1", code=1)
    assert _words("model missing:1 not found") in _words(res.output), res.output


def test_deploying_an_adapter_runs_it_in_its_bases_engine_with_lora_on(cp, models):  # noqa: F811
    url, home = cp
    cli(url, "model", "upload", "--name", "tiny-llm", "--path", str(models["base"]))
    for adapter in ("adapter", "rank16", "mlp"):
        cli(url, "model", "upload", "--name", "support-bot", "--path", str(models[adapter]), "--base", "tiny-llm:1")
    options = ("--aux-config", "dtype=float32", "max_model_len=512")
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "chat", "--model", "tiny-llm:1", *options)
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "support", "--model", "support-bot:1", *options)
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "support2", "--model", "support-bot:2", *options)
    key = engine_key("tiny-llm", 1, {"dtype": "float32", "max_model_len": 512})
    listed = {e["name"]: e for e in json.loads(cli(url, "endpoint", "list", "--json").output)}
    assert listed["support"]["targets"][0]["served_by"] == {
        "engine": key, "url": None, "options": "dtype=float32 max_model_len=512", "adapter": "support-bot:1"}
    with control(home) as c:
        snapshot = c.get("/config").json()
    (spec,) = wanted_engines(snapshot).values()
    assert spec.key == key and spec.adapters.keys() == {"support-bot:1", "support-bot:2"}
    assert spec.lora == (16, 4), "rank 16 holds both adapters (vLLM's default, at least); 4 adapters at once"
    line = vllm_command(__import__("pathlib").Path("py"), spec, __import__("pathlib").Path("/m"), 1, 1.0)
    assert line[line.index("--enable-lora"):][:5] == ["--enable-lora", "--max-lora-rank", "16", "--max-loras", "4"]
    # an external engine cannot take it; an engine sized below its rank refuses it
    res = cli(url, "model", "add", "--engine", "vllm", "--endpoint", "ext", "--model", "support-bot:1",
              "--aux-config", "url=http://gpu:8000/v1", code=1)
    assert _words("is a LoRA adapter of tiny-llm:1: it is loaded into the engines the platform starts") \
        in _words(res.output), res.output
    res = cli(url, "model", "add", "--engine", "vllm", "--endpoint", "small", "--model", "support-bot:2",
              *options, "max_lora_rank=8", code=1)
    assert _words("support-bot:2's LoRA rank 16 is above the engine's max_lora_rank 8") in _words(res.output)
    # the base stays while an adapter of it is served
    cli(url, "endpoint", "remove", "--endpoint", "chat")
    res = cli(url, "model", "remove", "--name", "tiny-llm", code=1)
    assert _words("deployed on endpoint(s) support, support2") in _words(res.output), res.output


def test_an_adapter_with_no_options_joins_its_bases_engine_and_takes_its_options(cp, models):  # noqa: F811
    """The defect issue 45 names: an adapter deployed with no --aux-config next to a base with options
    keyed a second engine of the base with vLLM's defaults."""
    url, home = cp
    cli(url, "model", "upload", "--name", "opt-base", "--path", str(models["base"]))
    cli(url, "model", "upload", "--name", "opt-bot", "--path", str(models["adapter"]), "--base", "opt-base:1")
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "opt-chat", "--model", "opt-base:1",
        "--aux-config", "dtype=float32", "max_model_len=512")
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "opt-support", "--model", "opt-bot:1")
    key = engine_key("opt-base", 1, {"dtype": "float32", "max_model_len": 512})
    listed = {e["name"]: e for e in json.loads(cli(url, "endpoint", "list", "--json").output)}
    assert listed["opt-support"]["targets"][0]["served_by"]["engine"] == key
    with control(home) as c:
        snapshot = c.get("/config").json()
    specs = [s for s in wanted_engines(snapshot).values() if s.key.startswith("opt-base:")]
    assert [s.key for s in specs] == [key], "one engine of the base, not a second with vLLM's defaults"
    assert specs[0].options["dtype"] == "float32" and specs[0].adapters.keys() == {"opt-bot:1"}
    # the same options again are the same engine; other ones are refused, naming them
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "opt-same", "--model", "opt-bot:1",
        "--aux-config", "dtype=float32", "max_model_len=512")
    res = cli(url, "model", "add", "--engine", "vllm", "--endpoint", "opt-other", "--model", "opt-bot:1",
              "--aux-config", "dtype=bfloat16", code=1)
    assert res.output.startswith("error 422:"), res.output
    assert _words("opt-bot:1 is a LoRA adapter of opt-base:1, which runs in an engine with dtype=float32 "
                  "max_model_len=512: its options dtype=bfloat16 (the engine: float32), max_model_len=unset "
                  "(the engine: 512) differ from that engine's") in _words(res.output), res.output
    # a base in two engines: an adapter without options must say which
    cli(url, "model", "add", "--engine", "vllm", "--endpoint", "opt-long", "--model", "opt-base:1",
        "--aux-config", "dtype=float32", "max_model_len=256")
    res = cli(url, "model", "add", "--engine", "vllm", "--endpoint", "opt-which", "--model", "opt-bot:1", code=1)
    assert _words("which runs in 2 engines") in _words(res.output) and \
        _words("name the one to join with its --aux-config options") in _words(res.output), res.output

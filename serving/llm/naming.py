"""Which engine serves an endpoint's model version: one per model version and set of launch options.

Why not one per version: the launch options (``dtype``, ``max_model_len``, ``extra_args``, ...) fix what
the engine computes, so two endpoints that deploy the same version with different options must not share
an engine started with the first one's (a float32 endpoint answering with a half-precision engine is a
wrong answer with status 200). Endpoints whose options are equal share one engine. The key is also the
engine's ``--served-model-name``: ``MODEL:VERSION`` with no options (as before), else
``MODEL:VERSION@<8 hex digits of the options' hash>``. The launcher, its metrics, the workers and the
registry's listings all derive it here, so they always agree.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any, Mapping

EXTERNAL = ("url", "served_model_name")  # options of an engine that runs elsewhere: nothing to launch


def launch_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """The options that decide how an engine the platform starts runs (unset ones left out)."""
    return {k: v for k, v in sorted((options or {}).items()) if k not in EXTERNAL and v not in (None, [], "")}


def engine_key(model: str, version: int, options: Mapping[str, Any] | None = None) -> str:
    launch = launch_options(options)
    if not launch:
        return f"{model}:{version}"
    digest = hashlib.sha256(json.dumps(launch, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    return f"{model}:{version}@{digest[:8]}"


def describe_options(options: Mapping[str, Any] | None) -> str:
    """``dtype=float32 max_model_len=512``, or ``defaults``: what a listing shows of an engine's options."""
    launch = launch_options(options)
    return " ".join(f"{k}={' '.join(v) if isinstance(v, list) else v}" for k, v in launch.items()) or "defaults"


def served_by(model: str, version: int, options: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where a ``vllm`` endpoint's version runs: an external engine's URL, or the platform's engine key."""
    opts = dict(options or {})
    if opts.get("url"):
        return {"engine": str(opts.get("served_model_name") or model), "url": opts["url"], "options": "external"}
    return {"engine": engine_key(model, version, opts), "url": None, "options": describe_options(opts)}

"""A LoRA adapter's endpoint joins the engine its base is already served by.

Why: an adapter runs inside its base's engine (docs/llm-lora.md), and which engine that is follows from
the endpoint's launch options (serving/llm/naming.py: one engine per version and set of options). An
adapter deployed with no ``--aux-config`` next to a base deployed with ``dtype=float32
max_model_len=512`` would otherwise key a second engine of the base with vLLM's defaults: the base's
weights twice in memory, and the adapter's answers from a half-precision engine (a wrong answer with
status 200). So at deploy time the adapter's endpoint takes the launch options of the engine its base
runs in; options it gives that no such engine has are refused, naming them.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry.errors import Unprocessable
from registry.orm import Endpoint, ModelVersion
from registry.schemas import LLM_ENGINES
from serving.llm.naming import launch_options, lora_base


def join_base_engine(s: Session, endpoint: str, adapter: ModelVersion, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` with the launch options of the engine the adapter's base already runs in (the endpoint's
    own replicas, routing and LoRA sizing kept). Unchanged when the base runs nowhere yet (its engine
    starts with these options), or when they already name one of its engines."""
    base = lora_base(adapter.signature)
    if base is None or options.get("url"):
        return options
    label, base_label = f"{adapter.name}:{adapter.version}", f"{base['name']}:{base['version']}"
    engines = base_engines(s, endpoint, (str(base["name"]), int(base["version"])))
    mine = launch_options(options)
    if not engines or _frozen(mine) in engines:
        return options
    if mine:
        raise Unprocessable(f"{label} is a LoRA adapter of {base_label}, which runs in "
                            f"{_describe(engines.values())}: its options {_conflicts(mine, engines)} differ from "
                            "that engine's; deploy it with no engine options (it takes the engine's) or with "
                            "the same ones")
    if len(engines) > 1:
        raise Unprocessable(f"{label} is a LoRA adapter of {base_label}, which runs in {len(engines)} engines "
                            f"({_describe(engines.values())}): name the one to join with its --aux-config options")
    joined = next(iter(engines.values()))
    return {**options, **joined}


def base_engines(s: Session, endpoint: str, base: tuple[str, int]) -> dict[str, dict[str, Any]]:
    """The launch options of each engine the platform runs ``base`` in for other endpoints: those serving
    the base itself or another adapter of it (keyed by the options' canonical JSON)."""
    found: dict[str, dict[str, Any]] = {}
    q = select(Endpoint).where(Endpoint.engine.in_(LLM_ENGINES), Endpoint.name != endpoint)
    for ep in s.scalars(q):
        options = ep.engine_options or {}
        if options.get("url"):
            continue
        for t in ep.targets:
            runs_in = lora_base(t.model.signature)
            ref = (str(runs_in["name"]), int(runs_in["version"])) if runs_in else (t.model.name, t.model.version)
            if ref == base:
                launch = launch_options(options)
                found[_frozen(launch)] = launch
    return found


def _frozen(options: dict[str, Any]) -> str:
    return json.dumps(options, sort_keys=True, separators=(",", ":"))


def _describe(engines: Iterable[dict[str, Any]]) -> str:
    return " and ".join("an engine with " + (" ".join(f"{k}={v}" for k, v in e.items()) or "vLLM's defaults")
                        for e in engines)


def _conflicts(mine: dict[str, Any], engines: dict[str, dict[str, Any]]) -> str:
    """Each of the adapter's options that differs from the (first) engine's, with the engine's value."""
    theirs = next(iter(engines.values()))
    keys = sorted(set(mine) | set(theirs))
    return ", ".join(f"{k}={mine.get(k, 'unset')} (the engine: {theirs.get(k, 'unset')})"
                     for k in keys if mine.get(k) != theirs.get(k))

"""Routing policies over an engine's replicas, chosen per endpoint by name (``--aux-config routing=NAME``).

Each policy is a module of its own with a class taking no arguments; adding one is a module and a line
in serving/llm/routing/names.py's ``POLICIES`` (where the registry reads the names too). Every worker
process decides alone from what it sees (its own requests in flight, the engines' own queue gauges,
hashes of the request): there is no router process in between, and workers agree wherever a policy is a
pure function of the request (``session``), or places the keys they are fed alike (``prefix``:
key_homes.py).
docs/llm-routing.md says what each does and when to pick it.
"""
from __future__ import annotations

import importlib

from serving.llm.routing.names import DEFAULT, POLICIES, names  # noqa: F401 (the names, below the registry)
from serving.llm.routing.policies.base import Policy


def create(name: str | None) -> Policy:
    """A fresh policy (each replica set keeps its own: a rotation is per set of replicas)."""
    ref = POLICIES.get(name or DEFAULT)
    if ref is None:
        raise ValueError(f"routing {name!r} is not a policy; known: {', '.join(POLICIES)}")
    module, _, cls = ref.partition(":")
    return getattr(importlib.import_module(module), cls)()

"""Metric definitions and sampling rates, read from the control plane's snapshot.

Both sides need them: the recorder (``log_freq``) and the statistics service (which
variables to export, with which buckets or values). Parsing is forgiving: one bad
definition is skipped with a warning so the others keep working.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

KINDS = ("scalar", "enum", "value")


@dataclass(frozen=True)
class VariableDef:
    name: str
    kind: str  # scalar | enum | value
    buckets: tuple[float, ...] = ()
    values: tuple[str, ...] = ()


@dataclass(frozen=True)
class EndpointDefs:
    name: str
    log_freq: float = 1.0
    variables: dict[str, VariableDef] = field(default_factory=dict)
    versions: frozenset[str] = frozenset()  # version labels of its targets; empty: unknown

    def keeps(self, version: str, variable: str) -> bool:
        """Whether series of this version and variable are still part of the config."""
        return variable in self.variables and (not self.versions or version in self.versions)


def parse_variable(raw: dict[str, Any]) -> VariableDef:
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}")
    buckets = tuple(sorted(float(b) for b in raw.get("buckets") or ()))
    values = tuple(str(v) for v in raw.get("values") or ())
    if kind == "scalar" and not buckets:
        raise ValueError("scalar variable without buckets")
    if kind == "enum" and not values:
        raise ValueError("enum variable without values")
    return VariableDef(name=str(raw["name"]), kind=kind, buckets=buckets, values=values)


def _log_freq(value: Any) -> float:
    try:
        return min(1.0, max(0.0, float(value)))
    except (TypeError, ValueError):
        return 1.0


def parse_endpoint(name: str, raw: dict[str, Any]) -> EndpointDefs:
    variables: dict[str, VariableDef] = {}
    for item in raw.get("metrics") or ():
        try:
            var = parse_variable(item)
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("endpoint %s: skipping metric %r: %s", name, item, exc)
            continue
        variables[var.name] = var
    freq = raw.get("log_freq")
    versions = frozenset(str(t["version"]) for t in raw.get("targets") or () if isinstance(t, dict) and "version" in t)
    return EndpointDefs(name=name, log_freq=1.0 if freq is None else _log_freq(freq), variables=variables,
                        versions=versions)


def parse_snapshot(snapshot: dict[str, Any]) -> dict[str, EndpointDefs]:
    endpoints = snapshot.get("endpoints") or {}
    return {name: parse_endpoint(name, raw or {}) for name, raw in endpoints.items()}

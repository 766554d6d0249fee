"""Find the PromQL expressions shipped in dashboards and alert rules, and the metric names they use.

A small lexer, not a full parser: Prometheus itself (its query API and promtool)
checks the syntax; this only has to tell metric names from functions, keywords,
label names and numbers, which PromQL's grammar makes unambiguous once strings,
label matchers and range brackets are removed.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

import yaml

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan", "atan2"}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_OFFSET = re.compile(r"\boffset\s+-?(?:\d+[a-z]+)+")
_NUMBER = re.compile(r"(?<![\w:])(?:0x[0-9a-fA-F]+|\d+(?:\.\d*)?(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$", re.S)

# Grafana variables, replaced by values that keep the expression valid PromQL
GRAFANA_SUBSTITUTIONS = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}


def _strip_nested(text: str, open_: str, close: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


def metric_names(expr: str) -> set[str]:
    """Metric names used by ``expr``, including ``{__name__="..."}`` matchers."""
    names = set(re.findall(r'__name__\s*=\s*"([^"]+)"', expr))
    text = _STRING.sub('""', expr)
    text = _strip_nested(_strip_nested(text, "{", "}"), "[", "]")
    text = _GROUPING.sub(" ", _OFFSET.sub(" ", text))
    text = _NUMBER.sub(" ", text)
    for match in _NAME.finditer(text):
        word, rest = match.group(), text[match.end():].lstrip()
        if word in KEYWORDS or rest.startswith("("):
            continue
        names.add(word)
    return names


def grafana_query(expr: str, variables: dict[str, str]) -> str:
    """Substitute Grafana's built-in and template variables (``$name`` and ``${name}``)."""
    for key, value in GRAFANA_SUBSTITUTIONS.items():
        expr = expr.replace(key, value)
    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", lambda m: variables.get(m.group(1) or m.group(2), ".*"), expr)


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels") or [])  # collapsed rows hold their panels


def dashboard_expressions(path: Path) -> Iterator[tuple[str, str]]:
    """``(where, expr)`` for every panel target and every query-type template variable."""
    doc = json.loads(path.read_text())
    for panel in _panels(doc.get("panels") or []):
        for target in panel.get("targets") or []:
            if target.get("expr"):
                yield f"{path.name}: panel {panel.get('title')!r}", target["expr"]
    for var in (doc.get("templating") or {}).get("list") or []:
        if var.get("type") != "query":
            continue
        query = var.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        inner = _LABEL_VALUES.match(query or "")
        yield f"{path.name}: variable {var['name']!r}", inner.group(1) if inner else query


def rule_expressions(path: Path) -> Iterator[tuple[str, str]]:
    doc = yaml.safe_load(path.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            yield f"{path.name}: {rule.get('alert') or rule.get('record')}", rule["expr"]

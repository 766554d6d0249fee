"""Read deploy/.env and apply Compose's variable interpolation to a parsed compose file.

Compose interpolates after YAML parsing, in values only: ``$$`` is a literal ``$``;
``${VAR}``/``$VAR``; ``${VAR:-default}`` (unset or empty) and ``${VAR-default}`` (unset);
``${VAR:?message}``/``${VAR?message}`` fail. The schema check needs the interpolated
document, because e.g. ``image: ${SERVING_IMAGE}`` is not a valid image reference.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_TOKEN = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])((?:[^{}]|\{[^{}]*\})*))?\}|([A-Za-z_][A-Za-z0-9_]*))")


class InterpolationError(ValueError):
    pass


def read_env_file(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key.strip()):
            raise InterpolationError(f"{path}:{n}: not KEY=VALUE: {raw!r}")
        env[key.strip()] = value.strip().strip("'\"")
    return env


def interpolate_str(text: str, env: dict[str, str], used: set[str] | None = None) -> str:
    def repl(m: re.Match[str]) -> str:
        if m.group(1):
            return "$"
        name = m.group(2) or m.group(5)
        if used is not None:
            used.add(name)
        op, arg = m.group(3), m.group(4) or ""
        value = env.get(name)
        if op in (":-", "-"):
            missing = value is None or (op == ":-" and value == "")
            return interpolate_str(arg, env, used) if missing else value
        if op in (":?", "?"):
            if value is None or (op == ":?" and value == ""):
                raise InterpolationError(f"{name} is required: {arg}")
            return value
        if value is None:
            raise InterpolationError(f"{name} is not set (Compose would substitute an empty string)")
        return value

    return _TOKEN.sub(repl, text)


def interpolate(doc: Any, env: dict[str, str], used: set[str] | None = None) -> Any:
    if isinstance(doc, str):
        return interpolate_str(doc, env, used)
    if isinstance(doc, dict):
        return {k: interpolate(v, env, used) for k, v in doc.items()}
    if isinstance(doc, list):
        return [interpolate(v, env, used) for v in doc]
    return doc

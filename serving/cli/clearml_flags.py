"""ClearML Serving's command-line forms, so its README commands work as typed.

Its flags take several values after one flag (``--input-name a b c``, argparse's
``nargs='+'``), which click cannot declare; :func:`expand_variadic` rewrites them
into repeated flags before the CLI parses them. The other functions turn ClearML's
value syntax (``--input-size 1 28 28`` or ``"[-1, -1]" "[-1, -1]"``, ``--aux-config
key=value``) into the control plane's request fields.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

VARIADIC = frozenset({
    "--input-name", "--input-type", "--input-size", "--output-name", "--output-type", "--output-size",
    "--aux-config", "--weights", "--input-endpoints", "--variable-scalar", "--variable-enum", "--variable-value",
    "--variable", "--tags", "--requirements",
})

# ClearML's --framework names -> the registry's
FRAMEWORK_ALIASES = {"scikit-learn": "sklearn", "scikitlearn": "sklearn", "sklearn": "sklearn", "xgboost": "xgboost",
                     "lightgbm": "lightgbm", "onnx": "onnx", "pytorch": "pytorch", "torch": "pytorch",
                     "tensorflow": "tensorflow", "keras": "keras", "custom": "custom"}
_SUFFIX_FRAMEWORK = {".onnx": "onnx", ".pkl": "sklearn", ".pickle": "sklearn", ".joblib": "sklearn",
                     ".json": "xgboost", ".ubj": "xgboost", ".pt": "pytorch", ".pth": "pytorch"}


def expand_variadic(argv: list[str]) -> list[str]:
    """``--flag a b c`` -> ``--flag a --flag b --flag c`` for ClearML's multi-value flags."""
    out: list[str] = []
    flag: str | None = None
    for token in argv:
        if token.startswith("--"):
            flag = token if token in VARIADIC else None
            out.append(token)
        elif flag is not None and out[-1] != flag:
            out += [flag, token]
        else:
            out.append(token)
    return out


def framework_for(path: Path, framework: str | None) -> str:
    if framework:
        try:
            return FRAMEWORK_ALIASES[framework.strip().lower()]
        except KeyError:
            raise typer.BadParameter(f"unknown framework {framework!r}; one of {', '.join(sorted(FRAMEWORK_ALIASES))}")
    return _SUFFIX_FRAMEWORK.get(path.suffix.lower(), "custom")


def parse_sizes(values: list[str], flag: str) -> list[list[int]]:
    """``1 28 28`` is one tensor's dims; ``"[-1, -1]" "[-1, -1]"`` are two tensors' (ClearML's two forms)."""
    if not values:
        return []
    try:
        parsed = [json.loads(v) for v in values]
    except ValueError:
        raise typer.BadParameter(f"{flag} values must be numbers or JSON lists such as \"[-1, 128]\": {values}")
    if all(isinstance(p, int) for p in parsed):
        return [parsed]
    if all(isinstance(p, list) and all(isinstance(d, int) for d in p) for p in parsed):
        return parsed
    raise typer.BadParameter(f"{flag}: give dims as numbers (1 28 28) or one JSON list per tensor: {values}")


def io_declaration(names: list[str], types: list[str], sizes: list[list[int]], side: str) -> list[dict[str, Any]]:
    """One declared tensor per name; a single type or size applies to every name, as in ClearML."""
    if not names:
        if types or sizes:
            raise typer.BadParameter(f"--{side}-type/--{side}-size need --{side}-name to say which tensors they describe")
        return []
    types = types if len(types) != 1 else types * len(names)
    sizes = sizes if len(sizes) != 1 else sizes * len(names)
    for flag, values in ((f"--{side}-type", types), (f"--{side}-size", sizes)):
        if values and len(values) != len(names):
            raise typer.BadParameter(f"{flag} has {len(values)} value(s) for {len(names)} --{side}-name(s)")
    return [{"name": n, "dtype": types[i] if types else None, "shape": sizes[i] if sizes else None}
            for i, n in enumerate(names)]


# --aux-config keys -> the endpoint's batching fields; ClearML passes the rest into config.pbtxt
_AUX_BATCHING = {"max_batch_size": "max_batch_size", "dynamic_batching.max_queue_delay_microseconds": "max_queue_delay_us",
                 "dynamic_batching.preferred_batch_size": "preferred_batch_sizes", "instance_group.count": "instances"}
_AUX_IGNORED = ("platform", "default_model_filename")  # the model file and platform are known here


def aux_batching(pairs: list[str]) -> tuple[dict[str, Any], list[str]]:
    """The batching fields ``--aux-config`` sets, and the keys it was given that need nothing here."""
    batching: dict[str, Any] = {}
    ignored: list[str] = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise typer.BadParameter(f"--aux-config {pair!r} must look like key=value")
        key = key.strip()
        if key in _AUX_IGNORED:
            ignored.append(key)
            continue
        if key not in _AUX_BATCHING:
            raise typer.BadParameter(f"--aux-config {key} is not supported; supported: "
                                     f"{', '.join([*_AUX_BATCHING, *_AUX_IGNORED])}")
        try:
            batching[_AUX_BATCHING[key]] = json.loads(raw)
        except ValueError:
            raise typer.BadParameter(f"--aux-config {key}: {raw!r} is not a number or a JSON list")
    return batching, ignored


def endpoint_of(ref: str) -> tuple[str, int | None]:
    """ClearML names endpoint versions ``model/1`` (and prefixes ``model/*``); here versions are targets."""
    name, _, rest = ref.strip("/").partition("/")
    rest = rest.strip("*").lstrip("v")
    return name, int(rest) if rest.isdigit() else None

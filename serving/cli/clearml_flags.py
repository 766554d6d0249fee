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
                     "tensorflow": "tensorflow", "keras": "keras", "custom": "custom", "hf-causal-lm": "hf-causal-lm",
                     "torchserve": "torchserve", "mar": "torchserve"}
_SUFFIX_FRAMEWORK = {".onnx": "onnx", ".pkl": "sklearn", ".pickle": "sklearn", ".joblib": "sklearn",
                     ".json": "xgboost", ".ubj": "xgboost", ".pt": "pytorch", ".pth": "pytorch", ".mar": "torchserve"}


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
    known = _SUFFIX_FRAMEWORK.get(path.suffix.lower())
    if known:
        return known
    return "onnx" if _is_onnx(path) else "custom"


def _is_onnx(path: Path) -> bool:
    """A file named otherwise (ClearML's huggingface example uploads ``model.bin``) that parses as an
    ONNX model with a graph."""
    try:
        import onnx

        model = onnx.load_model(str(path), load_external_data=False)
    except Exception:
        return False
    return len(model.graph.node) > 0 and model.ir_version > 0


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


def aux_pairs(items: list[str]) -> dict[str, str] | None:
    """``--aux-config a=1 b.c="x"`` -> the pairs sent as typed; the control plane reads them against
    Triton's schema (serving/triton/aux_config.py) and answers a 422 naming a bad key."""
    from serving.triton.aux_config import AuxConfigError, split_pairs

    if not items:
        return None
    if len(items) == 1 and "=" not in items[0] and Path(items[0]).is_file():  # ClearML: a config.pbtxt file
        return _pbtxt_pairs(Path(items[0]))
    try:
        return split_pairs(items)
    except AuxConfigError as exc:
        raise typer.BadParameter(f"--aux-config {exc}")


def _pbtxt_pairs(path: Path) -> dict[str, str]:
    """A config.pbtxt file as dotted key=value pairs (its leaves; lists and lists of groups as JSON)."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2 as mc

    try:
        config = text_format.Parse(path.read_text(), mc.ModelConfig())
    except (text_format.ParseError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(f"--aux-config {path} is not a config.pbtxt Triton reads: {exc}")
    pairs: dict[str, str] = {}

    def walk(tree: dict[str, Any], prefix: str) -> None:
        for key, value in tree.items():
            if isinstance(value, dict) and key != "parameters":
                walk(value, f"{prefix}{key}.")
            else:
                pairs[f"{prefix}{key}"] = json.dumps(value)

    walk(json_format.MessageToDict(config, preserving_proto_field_name=True), "")
    return pairs


def aux_notes(pairs: dict[str, str] | None, triton_config: dict[str, Any] | None = None) -> list[str]:
    """What became of each --aux-config key, said once after the control plane accepted them.

    ``triton_config``: the endpoint's config.pbtxt fields as the control plane answered them; it holds
    the backend ``platform``/``backend`` named only when they named the format of a model uploaded
    without one (registry/formats.py), and then those keys were used, not ignored."""
    from serving.triton.aux_config import parse_aux
    from serving.triton.model_formats import format_named

    if not pairs:
        return []
    aux = parse_aux(pairs)
    named = format_named(pairs.get("platform", ""), pairs.get("backend", ""))
    used = [k for k in ("platform", "backend") if k in pairs] if named is not None and \
        (triton_config or {}).get("backend") == named.backend else []
    notes = [f"--aux-config applied: {', '.join(aux.applied)}"] if aux.applied else []
    if used:
        notes.append(f"--aux-config {', '.join(used)}: named the format of the model, uploaded without one: "
                     f"served as {named.words} (Triton backend {named.backend!r})")
    if aux.kept:
        notes.append(f"--aux-config kept for an external Triton's config.pbtxt (the embedded Triton does not "
                     f"use them): {', '.join(aux.kept)}")
    ignored = [k for k in aux.ignored if k not in used]
    if ignored:
        notes.append(f"--aux-config ignored: {', '.join(ignored)} (the registry knows the model file "
                     "and its format; platform/backend only name the format of a model uploaded without one)")
    return notes


def endpoint_of(ref: str) -> tuple[str, int | None]:
    """ClearML names endpoint versions ``model/1`` (and prefixes ``model/*``); here versions are targets."""
    name, _, rest = ref.strip("/").partition("/")
    rest = rest.strip("*").lstrip("v")
    return name, int(rest) if rest.isdigit() else None

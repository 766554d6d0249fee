"""ClearML Serving's ``--aux-config key=value ...``: config.pbtxt fields, read against Triton's own schema.

ClearML's READMEs write them as the shell leaves them: ``platform="onnxruntime_onnx"`` (quotes kept
when escaped), lists as strings (``dynamic_batching.preferred_batch_size="[1,2,4]"``), dotted paths
into config.pbtxt. Every key is looked up in Triton's ``ModelConfig`` protobuf (bundled in
tritonclient), so an unknown or malformed key is refused naming the key, and a value is turned into
the type Triton declares for it. Then each key goes one of three ways:

* applied: the batching the platform itself runs (max batch size, queue delay, preferred sizes, instances);
* ignored: what the registry already knows (the model file, its format, the model's name);
* kept: any other config.pbtxt field, written into an external Triton's config.pbtxt
  (serving/triton/repository.py); the embedded Triton does not use them.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

# --aux-config key -> the endpoint's batching field
APPLIED = {"max_batch_size": "max_batch_size",
           "dynamic_batching.max_queue_delay_microseconds": "max_queue_delay_us",
           "dynamic_batching.preferred_batch_size": "preferred_batch_sizes",
           "instance_group.count": "instances"}
IGNORED = ("name", "platform", "backend", "default_model_filename")  # the registry knows the model file and format


class AuxConfigError(ValueError):
    """A key that is not a config.pbtxt field, or a value Triton would not take for it."""


@dataclass
class AuxConfig:
    batching: dict[str, Any] = field(default_factory=dict)  # batching fields, by their name in the registry
    triton: dict[str, Any] = field(default_factory=dict)  # other fields, nested as config.pbtxt's JSON form
    applied: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def split_pairs(items: list[str]) -> dict[str, str]:
    """``["a=1", "b.c=\"x\""]`` -> ``{"a": "1", "b.c": "\"x\""}``; values are read by :func:`parse_aux`."""
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise AuxConfigError(f"{item!r} must look like key=value, e.g. max_batch_size=16")
        pairs[key.strip()] = value
    return pairs


def parse_aux(pairs: dict[str, str]) -> AuxConfig:
    """Sort each key (applied, kept or ignored) and read its value as Triton's schema types it."""
    from tritonclient.grpc import model_config_pb2 as mc

    out = AuxConfig()
    for key, raw in pairs.items():
        if key.startswith("parameters.") and key.count(".") == 1:  # config.pbtxt's map of string parameters
            out.triton.setdefault("parameters", {})[key.split(".", 1)[1]] = {"string_value": _unquote(raw)}
            out.kept.append(key)
            continue
        value = _typed(key, raw, mc.ModelConfig.DESCRIPTOR)
        if key in IGNORED:
            out.ignored.append(key)
        elif key in APPLIED:
            out.batching[APPLIED[key]] = value
            out.applied.append(key)
        else:
            _put(out.triton, key, value, mc.ModelConfig.DESCRIPTOR)
            out.kept.append(key)
    check_triton_config(out.triton)
    return out


def check_triton_config(tree: dict[str, Any]) -> None:
    """The nested fields must parse as Triton's ModelConfig (its JSON form), or they are refused."""
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2 as mc

    try:
        json_format.ParseDict(tree, mc.ModelConfig())
    except json_format.ParseError as exc:
        raise AuxConfigError(f"does not fit Triton's config.pbtxt schema: {exc}") from None


def _field(key: str, descriptor: Any) -> Any:
    """The protobuf field a dotted key names, walking through nested (and repeated) messages."""
    parts = key.split(".")
    for i, part in enumerate(parts):
        f = descriptor.fields_by_name.get(part)
        if f is None:
            where = ".".join(parts[:i]) or "config.pbtxt"
            raise AuxConfigError(f"{key}: {part!r} is not a field of {where} in Triton's model configuration")
        if i < len(parts) - 1:
            if f.message_type is None or f.message_type.GetOptions().map_entry:
                raise AuxConfigError(f"{key}: {'.'.join(parts[:i + 1])} takes a value, it has no field {parts[i + 1]!r}")
            descriptor = f.message_type
    return f


def _put(tree: dict[str, Any], key: str, value: Any, descriptor: Any) -> None:
    """Place ``value`` at the dotted ``key``; a repeated message on the way is its first element."""
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        f = descriptor.fields_by_name[part]
        if is_repeated(f):
            node = node.setdefault(part, [{}])[0]
        else:
            node = node.setdefault(part, {})
        descriptor = f.message_type
    node[parts[-1]] = value


def is_repeated(f: Any) -> bool:
    flag = getattr(f, "is_repeated", None)  # protobuf >= 6; ``label`` is deprecated there
    return bool(flag) if flag is not None else f.label == f.LABEL_REPEATED


def _unquote(raw: str) -> str:
    text = raw.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        return text[1:-1]
    return text


def _typed(key: str, raw: str, descriptor: Any) -> Any:
    f = _field(key, descriptor)
    text = _unquote(raw)
    if is_repeated(f) and not (f.message_type and f.message_type.GetOptions().map_entry):
        if text.startswith("["):
            try:
                items = json.loads(text)
            except ValueError:
                raise AuxConfigError(f"{key}: {raw!r} is not a list such as \"[1,2,4]\"") from None
        else:
            items = [text] if f.message_type is None else None
        if not isinstance(items, list):
            raise AuxConfigError(f"{key}: give a list such as \"[1,2,4]\" (or one value), not {raw!r}")
        return [_scalar(key, item, f) for item in items]
    return _scalar(key, text, f)


def _scalar(key: str, value: Any, f: Any) -> Any:
    """One value as the field's type: numbers from text or numbers, enums by name, messages from JSON."""
    text = value if isinstance(value, str) else json.dumps(value)
    cpp = f.cpp_type
    integer = cpp in (f.CPPTYPE_INT32, f.CPPTYPE_INT64, f.CPPTYPE_UINT32, f.CPPTYPE_UINT64)
    try:
        if integer:
            number = int(text)
            if cpp in (f.CPPTYPE_UINT32, f.CPPTYPE_UINT64) and number < 0:
                raise ValueError
            return number
        if cpp in (f.CPPTYPE_FLOAT, f.CPPTYPE_DOUBLE):
            return float(text)
    except ValueError:
        raise AuxConfigError(f"{key}: {value!r} is not {'a whole number' if integer else 'a number'}") from None
    if cpp == f.CPPTYPE_BOOL:
        if text.lower() not in ("true", "false", "1", "0"):
            raise AuxConfigError(f"{key}: {value!r} is not true or false")
        return text.lower() in ("true", "1")
    if cpp == f.CPPTYPE_ENUM:
        names = list(f.enum_type.values_by_name)
        if text not in names:
            raise AuxConfigError(f"{key}: {value!r} is not one of {', '.join(names)}")
        return text
    if cpp == f.CPPTYPE_MESSAGE:
        if isinstance(value, dict):
            return value
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise AuxConfigError(f"{key} is a group of settings: give its fields as {key}.FIELD=VALUE")
        return parsed
    return text


"""Declared inputs and outputs (ClearML Serving's ``--input-name/-type/-size`` flags), checked at deploy.

Why at deploy: a declaration that does not fit the model would otherwise turn into
a wrong answer or a backend error on every request. The control plane compares it
with the model's signature once and answers 422 naming the tensor, so the worker
can bind tensors by name and trust the result.

Shapes follow Triton's ``dims``: with batching on (``max_batch_size > 0``) they do
not include the batch dimension; with it off (ClearML's default) they are the whole
tensor. The stored form is always the whole shape, batch dimension included.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from registry import schemas

TRITON_DTYPES = ("BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64",
                 "FP16", "FP32", "FP64", "BYTES")
_NUMPY = {"BOOL": "bool", "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64",
          "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
          "FP16": "float16", "FP32": "float32", "FP64": "float64", "BYTES": "object"}


class IOMismatch(ValueError):
    """The declaration does not fit the model: the client gets a 422 with this message."""


def triton_dtype(text: str) -> str:
    """``float32``, ``np.float32``, ``FP32`` or ``TYPE_FP32`` -> ``FP32``."""
    name = text.strip().removeprefix("TYPE_").removeprefix("np.").removeprefix("numpy.")
    if name.upper() in TRITON_DTYPES:
        return name.upper()
    try:
        dtype = np.dtype(name)
    except TypeError:
        raise IOMismatch(f"unknown data type {text!r} (use numpy names such as float32, int64)") from None
    for triton, numpy_name in _NUMPY.items():
        if numpy_name != "object" and np.dtype(numpy_name) == dtype:
            return triton
    raise IOMismatch(f"data type {text!r} has no Triton equivalent")


def _whole(shape: list[int] | None, batching: bool) -> list[int] | None:
    if shape is None:
        return None
    if any(d < -1 or d == 0 for d in shape):
        raise IOMismatch(f"shape {shape}: dimensions must be positive, or -1 for any size")
    return [-1, *shape] if batching else list(shape)


def normalize(decl: schemas.IODeclaration, max_batch_size: int) -> dict[str, Any]:
    """The stored form: Triton dtype names, whole shapes."""
    out: dict[str, Any] = {}
    for side in ("inputs", "outputs"):
        tensors = getattr(decl, side)
        names = [t.name for t in tensors]
        duplicate = sorted({n for n in names if names.count(n) > 1})
        if duplicate:
            raise IOMismatch(f"{side[:-1]} name(s) {duplicate} declared more than once")
        out[side] = [{"name": t.name, "dtype": triton_dtype(t.dtype) if t.dtype else None,
                      "shape": _whole(t.shape, max_batch_size > 0)} for t in tensors]
    return out


def check_against(io: dict[str, Any], signature: dict[str, Any], model_ref: str) -> None:
    """Every declared tensor must exist in the model, with a dtype it accepts and a shape that fits."""
    for side in ("inputs", "outputs"):
        actual = {t["name"]: t for t in signature.get(side) or []}
        declared = io.get(side) or []
        if not declared or not actual:
            continue
        for d in declared:
            spec = actual.get(d["name"])
            if spec is None:
                raise IOMismatch(f"declared {side[:-1]} {d['name']!r} is not an {side[:-1]} of {model_ref} "
                                 f"(its {side}: {list(actual)})")
            _check_dtype(side, d, spec, model_ref)
            _check_shape(side, d, spec, model_ref)
        if side == "inputs":
            missing = [n for n in actual if n not in {d["name"] for d in declared}]
            if missing:
                raise IOMismatch(f"model input(s) {missing} of {model_ref} are not declared: "
                                 f"--input-name must name every input, in the order preprocess returns them")


def _check_dtype(side: str, d: dict, spec: dict, model_ref: str) -> None:
    if d["dtype"] is None or d["dtype"] == spec["dtype"] or spec["dtype"] not in _NUMPY:
        return
    want, have = np.dtype(_NUMPY[d["dtype"]]), np.dtype(_NUMPY[spec["dtype"]])
    ok = np.can_cast(want, have, "safe") if side == "inputs" else np.can_cast(have, want, "safe")
    if not ok:
        raise IOMismatch(f"{side[:-1]} {d['name']!r} is declared {_NUMPY[d['dtype']]} but {model_ref} "
                         f"has {_NUMPY[spec['dtype']]}; the values would not convert without loss")


def _check_shape(side: str, d: dict, spec: dict, model_ref: str) -> None:
    shape, model_shape = d["shape"], spec.get("shape") or []
    if shape is None or not model_shape:
        return
    fits = len(shape) == len(model_shape) and all(a < 0 or b < 0 or a == b for a, b in zip(shape, model_shape))
    if not fits:
        raise IOMismatch(f"{side[:-1]} {d['name']!r} is declared with shape {shape} (batch dimension "
                         f"included) but {model_ref} has {model_shape} (-1: any size)")

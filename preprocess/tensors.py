"""Match what preprocessing (or a v2 request) produced against a model signature.

Bad shapes and dtypes are the client's mistake far more often than the model's, so
every mismatch becomes a :class:`PreprocessError` that names the tensor and what
was expected, instead of an opaque error from Triton or onnxruntime.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from preprocess.base import InputOutOfRange, PreprocessError

# Triton datatype names (model signatures use them) -> numpy
NP_DTYPES: dict[str, Any] = {
    "BOOL": np.bool_, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}


def numpy_dtype(triton_dtype: str) -> Any:
    try:
        return NP_DTYPES[triton_dtype]
    except KeyError:
        raise PreprocessError(f"unsupported datatype {triton_dtype!r}") from None


def _as_dict(data: Any, specs: Sequence[dict], declared: Sequence[dict]) -> dict[str, Any]:
    """Bind what preprocess returned to input names: a dict by its keys, a list by the declared
    names (``--input-name``), in that order; never by the model's input order, which need not be
    the order the user's code produces (a silent swap of two same-shaped inputs is a wrong answer)."""
    names = [d["name"] for d in declared] or [s["name"] for s in specs]
    if isinstance(data, dict):
        missing = [n for n in names if n not in data]
        if missing:
            raise PreprocessError(f"missing model input(s) {missing}; the model takes {names}")
        return {n: data[n] for n in names}
    if len(names) == 1:  # one input: the whole value is its tensor, as in ClearML Serving
        if isinstance(data, (list, tuple)) and len(data) == 1 and isinstance(data[0], np.ndarray):
            data = data[0]
        return {names[0]: data}
    if not isinstance(data, (list, tuple)):
        raise PreprocessError(f"preprocess returned one tensor; the model takes {len(names)} inputs {names}: "
                              "return a dict {input name: tensor}")
    if not declared:
        raise PreprocessError(f"preprocess returned a list of {len(data)} tensors and the endpoint declares no "
                              f"input names; the model takes {names}: return a dict {{input name: tensor}}, or "
                              "deploy with --input-name naming the list's tensors in order")
    if len(data) != len(names):
        raise PreprocessError(f"preprocess returned {len(data)} tensor(s); the endpoint declares {len(names)}: {names}")
    return dict(zip(names, data))


def _array(name: str, value: Any, dtype: Any, label: str) -> np.ndarray:
    try:
        array = np.asarray(value)
        if array.dtype == object and dtype is not np.object_:
            raise ValueError("ragged or non-numeric values")
        if dtype is not np.object_ and array.dtype.kind not in "biuf":
            raise ValueError(f"values of type {array.dtype} are not numbers")
        if dtype is not np.object_ and array.dtype.kind == "f" and np.dtype(dtype).kind in "iu":
            if not np.all(np.mod(array, 1) == 0):
                raise ValueError("non-integer values for an integer tensor")
        return array.astype(dtype, copy=False)
    except (TypeError, ValueError) as exc:
        raise PreprocessError(f"input {name!r}: cannot make a {label} tensor ({exc})") from None


def _fits(shape: tuple[int, ...], expected: Sequence[int]) -> bool:
    return len(shape) == len(expected) and all(e < 0 or e == s for s, e in zip(shape, expected))


def _fit_declared(name: str, array: np.ndarray, shape: Sequence[int] | None) -> np.ndarray:
    """The declared size is the tensor's shape; a tensor with exactly as many values as a fixed
    declared shape takes it (ClearML's Keras example sends a 28x28 image to a 784-wide input)."""
    if not shape or _fits(array.shape, shape):
        return array
    per_row = int(np.prod([d for d in shape[1:]])) if shape[0] < 0 else 0
    if all(d > 0 for d in shape) and array.size == int(np.prod(shape)):
        return array.reshape(shape)
    if shape[0] < 0 and all(d > 0 for d in shape[1:]) and per_row and array.size % per_row == 0:
        return array.reshape(-1, *shape[1:])
    want = "[" + ", ".join("-1" if d < 0 else str(d) for d in shape) + "]"
    raise PreprocessError(f"input {name!r} has shape {list(array.shape)}, the endpoint declares {want} (-1: any)")


def _cast(name: str, value: Any, spec: dict, declared_shape: Sequence[int] | None = None) -> np.ndarray:
    array = _fit_declared(name, _array(name, value, numpy_dtype(spec["dtype"]), spec["dtype"]), declared_shape)
    _check_shape(name, array.shape, spec.get("shape") or [])
    _check_limits(name, array, spec)
    return array


def _check_limits(name: str, array: np.ndarray, spec: dict) -> None:
    """The model's own limits (``registry/signature.py``): token ids inside its vocabulary, sequences
    no longer than its position table. Past them a model fails or, worse, reads garbage."""
    top, longest = spec.get("max_value"), spec.get("max_length")
    if top is not None and array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high > top:
            bad = high if high > top else low
            raise InputOutOfRange(f"input {name!r} has value {bad}; the model takes 0 to {top} "
                                  f"(its vocabulary has {top + 1} entries)")
    if longest is not None and array.ndim == 2 and array.shape[1] > longest:
        raise InputOutOfRange(f"input {name!r} has {array.shape[1]} positions; the model takes at most {longest}")


def _check_shape(name: str, shape: tuple[int, ...], expected: list[int]) -> None:
    if not expected:
        return
    if not _fits(shape, expected):
        want = "[" + ", ".join("-1" if e < 0 else str(e) for e in expected) + "]"
        raise PreprocessError(f"input {name!r} has shape {list(shape)}, the model expects {want} (-1: any)")


def to_model_inputs(data: Any, specs: Sequence[dict], declared: Sequence[dict] = ()) -> dict[str, np.ndarray]:
    """Tensors for the model's inputs, in signature order, with the signature's dtypes.

    ``declared``: the endpoint's declared inputs (name, dtype, whole shape), in the order a
    returned list is bound; a model without a signature (a Python-backend model.py uploaded alone) is
    served with them, as its config.pbtxt was written from them. Without either (a custom framework)
    the data passes through."""
    if not specs and declared and all(d.get("dtype") for d in declared):
        specs = declared
    if not specs:
        return data if isinstance(data, dict) else {"input": np.asarray(data)}
    bound = _as_dict(data, specs, declared)
    shapes = {d["name"]: d.get("shape") for d in declared}
    return {s["name"]: _cast(s["name"], bound[s["name"]], s, shapes.get(s["name"])) for s in specs}


def clearml_outputs(outputs: dict[str, np.ndarray], declared: Sequence[dict] = ()) -> Any:
    """What ClearML Serving hands ``postprocess``: one output as an array, several as a list, in the
    declared order (``--output-name``) or the model's, as the declared type (``--output-type``)."""
    if not declared:
        values = list(outputs.values())
    else:
        missing = [d["name"] for d in declared if d["name"] not in outputs]
        if missing:
            raise PreprocessError(f"the model returned no output(s) {missing}; it returned {list(outputs)}")
        values = [outputs[d["name"]] if not d.get("dtype") or d["dtype"] == "BYTES"
                  else np.asarray(outputs[d["name"]]).astype(numpy_dtype(d["dtype"]), copy=False) for d in declared]
    return values[0] if len(values) == 1 else values

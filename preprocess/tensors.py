"""Match what preprocessing (or a v2 request) produced against a model signature.

Bad shapes and dtypes are the client's mistake far more often than the model's, so
every mismatch becomes a :class:`PreprocessError` that names the tensor and what
was expected, instead of an opaque error from Triton or onnxruntime.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from preprocess.base import PreprocessError

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


def _as_dict(data: Any, specs: Sequence[dict]) -> dict[str, Any]:
    names = [s["name"] for s in specs]
    if isinstance(data, dict):
        missing = [n for n in names if n not in data]
        if missing:
            raise PreprocessError(f"missing model input(s) {missing}; the model takes {names}")
        return {n: data[n] for n in names}
    if isinstance(data, np.ndarray) or not isinstance(data, (list, tuple)):
        data = [data]
    elif len(specs) == 1 and data and not isinstance(data[0], (np.ndarray, list, tuple)):
        data = [data]  # a flat list is one tensor, not one scalar per input
    if len(data) != len(names):
        raise PreprocessError(f"got {len(data)} tensor(s), the model takes {len(names)}: {names}")
    return dict(zip(names, data))


def _cast(name: str, value: Any, spec: dict) -> np.ndarray:
    dtype = numpy_dtype(spec["dtype"])
    try:
        array = np.asarray(value)
        if array.dtype == object and dtype is not np.object_:
            raise ValueError("ragged or non-numeric values")
        if dtype is not np.object_ and array.dtype.kind not in "biuf":
            raise ValueError(f"values of type {array.dtype} are not numbers")
        if dtype is not np.object_ and array.dtype.kind == "f" and np.dtype(dtype).kind in "iu":
            if not np.all(np.mod(array, 1) == 0):
                raise ValueError("non-integer values for an integer tensor")
        array = array.astype(dtype, copy=False)
    except (TypeError, ValueError) as exc:
        raise PreprocessError(f"input {name!r}: cannot make a {spec['dtype']} tensor ({exc})") from None
    _check_shape(name, array.shape, spec.get("shape") or [])
    return array


def _check_shape(name: str, shape: tuple[int, ...], expected: list[int]) -> None:
    if not expected:
        return
    if len(shape) != len(expected) or any(e >= 0 and e != s for s, e in zip(shape, expected)):
        want = "[" + ", ".join("-1" if e < 0 else str(e) for e in expected) + "]"
        raise PreprocessError(f"input {name!r} has shape {list(shape)}, the model expects {want} (-1: any)")


def to_model_inputs(data: Any, specs: Sequence[dict]) -> dict[str, np.ndarray]:
    """Tensors for the model's inputs, in signature order, with the signature's dtypes.

    Without a signature (a custom framework) the data passes through as given."""
    if not specs:
        return data if isinstance(data, dict) else {"input": np.asarray(data)}
    return {name: _cast(name, value, spec) for (name, value), spec in zip(_as_dict(data, specs).items(), specs)}


def clearml_outputs(outputs: dict[str, np.ndarray], names: Sequence[str]) -> Any:
    """What ClearML Serving hands ``postprocess``: one output as an array, several as a list."""
    if len(names) == 1:
        return outputs[names[0]]
    return [outputs[n] for n in names]

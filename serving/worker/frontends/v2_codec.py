"""Open Inference Protocol v2 tensors on the wire: JSON, and Triton's binary tensor extension.

The binary extension matters because ``tritonclient.http`` uses it by default: the
body is the JSON header (its length in ``Inference-Header-Content-Length``)
followed by raw tensor bytes, in input order, for inputs whose
``parameters.binary_data_size`` is set. BYTES tensors use Triton's 4-byte
length-prefixed layout, for which ``tritonclient.utils`` has the codec.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from tritonclient.utils import (deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor,
                                triton_to_np_dtype)

from serving.worker.errors import BadRequest

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class V2Request:
    id: str | None
    inputs: dict[str, np.ndarray]
    outputs: dict[str, bool] | None  # requested output -> binary; None: all outputs
    binary_default: bool


def _dtype(datatype: Any, name: str) -> Any:
    dtype = triton_to_np_dtype(datatype) if isinstance(datatype, str) else None
    if dtype is None:
        raise BadRequest(f"input {name!r}: unknown datatype {datatype!r}")
    return dtype


def _shape(spec: dict, name: str) -> list[int]:
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: \"shape\" must be a list of non-negative integers")
    return shape


def _from_json(spec: dict, name: str, dtype: Any, shape: list[int]) -> np.ndarray:
    if "data" not in spec:
        raise BadRequest(f"input {name!r} has no \"data\"")
    try:
        if dtype == np.object_:
            flat = [s.encode() if isinstance(s, str) else s for s in np.asarray(spec["data"], dtype=object).ravel()]
            array = np.array(flat, dtype=np.object_)
        else:
            array = np.asarray(spec["data"], dtype=dtype)
        return array.reshape(shape)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"input {name!r}: data does not fit shape {shape} and datatype "
                         f"{spec.get('datatype')} ({exc})") from None


def _from_binary(chunk: bytes, name: str, dtype: Any, shape: list[int]) -> np.ndarray:
    try:
        array = deserialize_bytes_tensor(chunk) if dtype == np.object_ else np.frombuffer(chunk, dtype=dtype)
        return array.reshape(shape)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"input {name!r}: binary data does not fit shape {shape} ({exc})") from None


def decode_request(raw: bytes, header_length: str | None) -> V2Request:
    try:
        cut = int(header_length) if header_length else len(raw)
        header = orjson.loads(raw[:cut])
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise BadRequest(f"malformed v2 inference request: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list) or not header["inputs"]:
        raise BadRequest('a v2 inference request needs a non-empty "inputs" list')
    inputs, offset = {}, cut
    for spec in header["inputs"]:
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str):
            raise BadRequest('every input needs a "name"')
        dtype, shape = _dtype(spec.get("datatype"), name), _shape(spec, name)
        size = (spec.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            if offset + int(size) > len(raw):
                raise BadRequest(f"input {name!r}: binary_data_size {size} runs past the end of the body")
            inputs[name] = _from_binary(raw[offset:offset + int(size)], name, dtype, shape)
            offset += int(size)
        else:
            inputs[name] = _from_json(spec, name, dtype, shape)
    params = header.get("parameters") or {}
    binary_default = bool(params.get("binary_data_output", False))
    outputs = None
    if isinstance(header.get("outputs"), list):
        outputs = {o["name"]: bool((o.get("parameters") or {}).get("binary_data", binary_default))
                   for o in header["outputs"] if isinstance(o, dict) and "name" in o}
    return V2Request(header.get("id"), inputs, outputs, binary_default)


def encode_response(model: str, version: int, request: V2Request,
                    outputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The body and headers; binary when any requested output asked for it."""
    wanted = request.outputs if request.outputs is not None else {n: request.binary_default for n in outputs}
    missing = [n for n in wanted if n not in outputs]
    if missing:
        raise BadRequest(f"unknown output(s) {missing}; the model returns {list(outputs)}")
    entries, blobs = [], []
    for name, binary in wanted.items():
        array = np.asarray(outputs[name])
        datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            blob = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = [b.decode() if isinstance(b, bytes) else b for b in array.ravel().tolist()]
        entries.append(entry)
    header = {"model_name": model, "model_version": str(version), "outputs": entries}
    if request.id is not None:
        header["id"] = request.id
    head = orjson.dumps(header)
    if not blobs:
        return head, {"content-type": "application/json"}
    return head + b"".join(blobs), {"content-type": "application/octet-stream", HEADER_LENGTH: str(len(head))}

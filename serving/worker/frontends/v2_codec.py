"""Open Inference Protocol v2 tensors on the wire: JSON, and Triton's binary tensor extension.

The binary extension matters because ``tritonclient.http`` uses it by default: the
body is the JSON header (its length in ``Inference-Header-Content-Length``)
followed by raw tensor bytes, in input order, for inputs whose
``parameters.binary_data_size`` is set. BYTES tensors use Triton's 4-byte
length-prefixed layout, for which ``tritonclient.utils`` has the codec.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from tritonclient.utils import np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

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


MAX_ELEMENTS = 1 << 31  # no tensor of a request body that fits in memory has more


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _params(spec: dict, where: str) -> dict:
    """``parameters`` is an object when present; anything else is the client's mistake, not a 500."""
    params = spec.get("parameters")
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise BadRequest(f'{where}: "parameters" must be an object, got {type(params).__name__}')
    return params


def _shape(spec: dict, name: str) -> list[int]:
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise BadRequest(f"input {name!r}: \"shape\" must be a list of non-negative integers")
    if int(np.prod(shape, dtype=object)) > MAX_ELEMENTS:
        raise BadRequest(f"input {name!r}: shape {shape} has more elements than any request can carry")
    return shape


def _check_integers(array: np.ndarray, dtype: Any, name: str) -> None:
    """JSON numbers for an integer tensor must be integers that fit it: numpy would otherwise raise
    OverflowError (2**64), wrap around silently, or truncate floats."""
    if array.dtype.kind not in "iub":
        raise BadRequest(f"input {name!r}: data must be integers for datatype {np_to_triton_dtype(dtype)}")
    if array.size and array.dtype.kind != "b":
        info = np.iinfo(dtype)
        low, high = array.min(), array.max()
        if low < info.min or high > info.max:
            raise BadRequest(f"input {name!r}: value {low if low < info.min else high} is out of range of "
                             f"{np_to_triton_dtype(dtype)} [{info.min}, {info.max}]")


def _from_json(spec: dict, name: str, dtype: Any, shape: list[int]) -> np.ndarray:
    if "data" not in spec:
        raise BadRequest(f"input {name!r} has no \"data\"")
    try:
        if dtype == np.object_:
            flat = [s.encode() if isinstance(s, str) else s for s in np.asarray(spec["data"], dtype=object).ravel()]
            if not all(isinstance(s, bytes) for s in flat):
                raise BadRequest(f"input {name!r}: BYTES data must be strings")
            array = np.array(flat, dtype=np.object_)
        elif np.dtype(dtype).kind in "iu":
            inferred = np.asarray(spec["data"])
            _check_integers(inferred, np.dtype(dtype), name)
            array = inferred.astype(dtype)
        else:
            array = np.asarray(spec["data"], dtype=dtype)
        return array.reshape(shape)
    except (TypeError, ValueError, OverflowError) as exc:
        raise BadRequest(f"input {name!r}: data does not fit shape {shape} and datatype "
                         f"{spec.get('datatype')} ({exc})") from None


def _bytes_tensor(chunk: bytes, name: str) -> np.ndarray:
    """Triton's BYTES layout, each element a 4-byte little-endian length then that many bytes;
    checked as it is read (tritonclient's decoder trusts the lengths)."""
    items, i, end = [], 0, len(chunk)
    while i < end:
        if i + 4 > end:
            raise BadRequest(f"input {name!r}: BYTES data ends inside a 4-byte length prefix")
        (length,) = struct.unpack_from("<I", chunk, i)
        i += 4
        if i + length > end:
            raise BadRequest(f"input {name!r}: a BYTES element says {length} bytes, "
                             f"only {end - i} are left in its binary data")
        items.append(chunk[i:i + length])
        i += length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def _from_binary(chunk: bytes, name: str, dtype: Any, shape: list[int]) -> np.ndarray:
    array = _bytes_tensor(chunk, name) if dtype == np.object_ else None
    try:
        if array is None:
            array = np.frombuffer(chunk, dtype=dtype)
        return array.reshape(shape)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"input {name!r}: binary data does not fit shape {shape} ({exc})") from None


def binary_tensor(name: str, datatype: Any, shape: Any, chunk: bytes) -> np.ndarray:
    """One tensor in Triton's binary layout (the HTTP binary extension, gRPC's ``raw_input_contents``)."""
    dtype, dims = _dtype(datatype, name), _shape({"shape": shape}, name)
    return _from_binary(chunk, name, dtype, dims)


def data_tensor(name: str, datatype: Any, shape: Any, data: Any) -> np.ndarray:
    """One tensor from a list of values (JSON ``data``, gRPC's typed ``contents``), checked as JSON's."""
    dtype, dims = _dtype(datatype, name), _shape({"shape": shape}, name)
    return _from_json({"data": data, "datatype": datatype}, name, dtype, dims)


def wanted_outputs(requested: dict[str, bool] | None, binary_default: bool,
                   outputs: dict[str, np.ndarray]) -> dict[str, bool]:
    """Requested output -> binary, all outputs when none were named; an unknown name is the client's error."""
    wanted = requested if requested is not None else {n: binary_default for n in outputs}
    missing = [n for n in wanted if n not in outputs]
    if missing:
        raise BadRequest(f"unknown output(s) {missing}; the model returns {list(outputs)}")
    return wanted


def output_bytes(array: np.ndarray) -> tuple[str, bytes]:
    """An output's v2 datatype and its bytes in Triton's binary layout."""
    datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
    return datatype, serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()


def _header_length(header_length: str | None, total: int) -> int:
    if not header_length:
        return total
    text = header_length.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > total:
        raise BadRequest(f"{HEADER_LENGTH} must be a number of bytes no larger than the body ({total}), "
                         f"got {header_length!r}")
    return int(text)


def decode_request(raw: bytes, header_length: str | None) -> V2Request:
    cut = _header_length(header_length, len(raw))
    try:
        header = orjson.loads(raw[:cut])
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed v2 inference request: {exc}") from None
    if not isinstance(header, dict) or not isinstance(header.get("inputs"), list) or not header["inputs"]:
        raise BadRequest('a v2 inference request needs a non-empty "inputs" list')
    inputs, offset = {}, cut
    for spec in header["inputs"]:
        name = spec.get("name") if isinstance(spec, dict) else None
        if not isinstance(name, str):
            raise BadRequest('every input needs a "name"')
        dtype, shape = _dtype(spec.get("datatype"), name), _shape(spec, name)
        size = _params(spec, f"input {name!r}").get("binary_data_size")
        if size is not None:
            if not _is_int(size) or size < 0:
                raise BadRequest(f"input {name!r}: binary_data_size must be a non-negative integer, got {size!r}")
            if offset + size > len(raw):
                raise BadRequest(f"input {name!r}: binary_data_size {size} runs past the end of the body")
            inputs[name] = _from_binary(raw[offset:offset + size], name, dtype, shape)
            offset += size
        else:
            inputs[name] = _from_json(spec, name, dtype, shape)
    binary_default = bool(_params(header, "the request").get("binary_data_output", False))
    outputs = None
    if header.get("outputs") is not None:
        if not isinstance(header["outputs"], list):
            raise BadRequest('"outputs" must be a list')
        outputs = {}
        for o in header["outputs"]:
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise BadRequest('every requested output needs a "name"')
            outputs[o["name"]] = bool(_params(o, f"output {o['name']!r}").get("binary_data", binary_default))
    request_id = header.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest('"id" must be a string')
    return V2Request(request_id, inputs, outputs, binary_default)


def encode_response(model: str, version: int, request: V2Request,
                    outputs: dict[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The body and headers; binary when any requested output asked for it."""
    entries, blobs = [], []
    for name, binary in wanted_outputs(request.outputs, request.binary_default, outputs).items():
        array = np.asarray(outputs[name])
        datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            blob = output_bytes(array)[1]
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

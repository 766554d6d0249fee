"""v2 tensors in gRPC messages (``inference.ModelInferRequest`` / ``ModelInferResponse``).

The same checks as the HTTP codec (v2_codec.py), which this module calls: ``raw_input_contents``
is Triton's binary layout (BYTES elements 4-byte length-prefixed), typed ``contents`` are read as
JSON ``data`` would be. Answers always go in ``raw_output_contents``, as Triton's own server does.
"""
from __future__ import annotations

import numpy as np
from tritonclient.grpc import service_pb2

from serving.worker.errors import BadRequest
from serving.worker.frontends.v2_codec import V2Request, binary_tensor, data_tensor, output_bytes, wanted_outputs

CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents", "BYTES": "bytes_contents"}


def _typed(spec: service_pb2.ModelInferRequest.InferInputTensor) -> np.ndarray:
    field = CONTENTS.get(spec.datatype)
    if field is None:
        if spec.datatype in ("FP16", "BF16"):
            raise BadRequest(f"input {spec.name!r}: {spec.datatype} has no typed contents; use raw_input_contents")
        raise BadRequest(f"input {spec.name!r}: unknown datatype {spec.datatype!r}")
    if not spec.HasField("contents"):
        raise BadRequest(f"input {spec.name!r} has no data: set its contents.{field} or raw_input_contents")
    return data_tensor(spec.name, spec.datatype, list(spec.shape), list(getattr(spec.contents, field)))


def decode_infer_request(request: service_pb2.ModelInferRequest) -> V2Request:
    if not request.inputs:
        raise BadRequest("a v2 inference request needs at least one input")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
                         "send every input's data there, in input order, or none")
    inputs: dict[str, np.ndarray] = {}
    for i, spec in enumerate(request.inputs):
        if spec.name in inputs:
            raise BadRequest(f"input {spec.name!r} appears twice")
        if not spec.name:
            raise BadRequest("every input needs a name")
        inputs[spec.name] = (binary_tensor(spec.name, spec.datatype, list(spec.shape), raw[i]) if raw
                             else _typed(spec))
    outputs = {o.name: True for o in request.outputs} if request.outputs else None
    return V2Request(request.id or None, inputs, outputs, True)


def encode_infer_response(model: str, version: int, request: V2Request,
                          outputs: dict[str, np.ndarray]) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name=model, model_version=str(version), id=request.id or "")
    for name in wanted_outputs(request.outputs, True, outputs):
        array = np.asarray(outputs[name])
        datatype, blob = output_bytes(array)
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(blob)
    return response

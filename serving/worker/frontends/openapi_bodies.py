"""Request bodies in the worker's OpenAPI document.

The front ends read raw bodies (size cap first, then orjson or the binary tensor
extension), so FastAPI cannot infer their schemas. These describe what they accept,
for clients, for generated SDKs, and for the fuzzing test that sends bodies built
from them (tests/serving/test_fuzz.py).
"""
from __future__ import annotations

_TENSOR = {
    "type": "object", "required": ["name", "shape", "datatype", "data"],
    "properties": {
        "name": {"type": "string"}, "datatype": {"type": "string", "example": "INT64"},
        "shape": {"type": "array", "items": {"type": "integer"}},
        "data": {"type": "array", "items": {}}, "parameters": {"type": "object"},
    },
}

SERVE_BODY = {"requestBody": {"required": True, "content": {
    "application/json": {"schema": {"anyOf": [
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        {"type": "object", "properties": {"texts": {"type": "array", "items": {"type": "string"}}},
         "required": ["texts"]},
        {"type": "object", "properties": {"inputs": {"type": "object", "additionalProperties": {
            "type": "array", "items": {}}}}, "required": ["inputs"]},
        {},  # whatever the endpoint's preprocess.py takes
    ]}},
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
}}}

V2_INFER_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["inputs"],
    "properties": {
        "id": {"type": "string"}, "parameters": {"type": "object"},
        "inputs": {"type": "array", "items": _TENSOR},
        "outputs": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "parameters": {"type": "object"}}}},
    },
}}}}}

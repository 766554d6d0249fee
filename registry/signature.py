"""Read a model's input/output signature from its ONNX graph, in Triton's dtype names."""
from __future__ import annotations

from pathlib import Path

import onnx

# onnx.TensorProto element types -> Triton / Open Inference Protocol datatypes
ONNX_TO_TRITON = {
    1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64",
    8: "BYTES", 9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64", 16: "BF16",
}


class SignatureError(ValueError):
    pass


def _tensor(value_info) -> dict:
    ttype = value_info.type.tensor_type
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in ttype.shape.dim]
    return {"name": value_info.name, "dtype": ONNX_TO_TRITON.get(ttype.elem_type, "UNKNOWN"), "shape": dims}


def onnx_signature(path: Path) -> dict:
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and friends
        raise SignatureError(f"not a readable ONNX model: {exc}") from exc
    initializers = {i.name for i in model.graph.initializer}
    inputs = [_tensor(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_tensor(v) for v in model.graph.output]
    if not inputs or not outputs:
        raise SignatureError("ONNX model has no graph inputs or outputs")
    return {"inputs": inputs, "outputs": outputs}

"""Read a model's input/output signature from its ONNX graph, in Triton's dtype names.

Besides names, dtypes and shapes, the signature carries the limits an embedding table
puts on its inputs: the largest token id (``max_value``: the table's rows - 1) and the
longest sequence (``max_length``: rows of the position table). A request past them is
the client's mistake; knowing them here lets the worker answer 422 naming the input
and its limit, instead of a backend's out-of-range traceback.
"""
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
    _add_limits(model.graph, inputs)
    return {"inputs": inputs, "outputs": outputs}


def _rows(graph, name: str) -> int | None:
    init = next((i for i in graph.initializer if i.name == name), None)
    return int(init.dims[0]) if init is not None and len(init.dims) == 2 else None


def _add_limits(graph, inputs: list[dict]) -> None:
    """Token-id and length limits from embedding lookups: ``Gather(table, input)`` as exported, or
    onnxruntime's fused ``EmbedLayerNormalization`` (``--optimize``)."""
    vocab: dict[str, int] = {}
    positions: int | None = None
    for node in graph.node:
        if node.op_type == "Gather" and len(node.input) == 2:
            rows = _rows(graph, node.input[0])
            if rows is None:
                continue
            if "position" in node.input[0]:
                positions = rows
            else:
                vocab[node.input[1]] = rows
        elif node.op_type == "EmbedLayerNormalization" and len(node.input) >= 5:
            for ids, table in ((node.input[0], node.input[2]), (node.input[1], node.input[4])):
                if ids and _rows(graph, table):
                    vocab[ids] = _rows(graph, table)
            positions = _rows(graph, node.input[3]) or positions
    for spec in inputs:
        if spec["dtype"] not in ("INT32", "INT64") or len(spec["shape"]) != 2:
            continue
        if spec["name"] in vocab:
            spec["max_value"] = vocab[spec["name"]] - 1
        if positions and spec["shape"][1] < 0:
            spec["max_length"] = positions

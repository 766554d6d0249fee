"""Read a model's input/output signature from its ONNX graph, in Triton's dtype names.

Besides names, dtypes and shapes, the signature carries the limits an embedding table
puts on its inputs: the largest token id (``max_value``: the table's rows - 1) and the
longest sequence (``max_length``: rows of the position table). A request past them is
the client's mistake; knowing them here lets the worker answer 422 naming the input
and its limit, instead of a backend's out-of-range traceback.

A PyTorch checkpoint, TorchScript archive, exported program or safetensors file is recognised by its
content and, registered as anything else, refused with the way to serve it: that is the file a new
user has, and otherwise the answer would be a parse error (or, uploaded as ``custom``, a model no
engine but user code loads). TorchScript, ``.pt2`` files and state dicts with their model file upload
with ``serving model upload`` (serving/pytorch/); safetensors files and model folders get the ONNX
export instructions.
"""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import onnx

from serving.pytorch.kinds import TORCH_FRAMEWORKS, is_exported_program

# onnx.TensorProto element types -> Triton / Open Inference Protocol datatypes
ONNX_TO_TRITON = {
    1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64",
    8: "BYTES", 9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64", 16: "BF16",
}


class SignatureError(ValueError):
    pass


_HOW_TO_EXPORT = (
    "A Hugging Face model: `pip install optimum-onnx`, `optimum-cli export onnx --model MODEL_DIR --task "
    "text-classification OUT_DIR/`, then `serving model upload --path OUT_DIR/model.onnx` and `serving model add "
    "... --tokenizer OUT_DIR`; any PyTorch module: `torch.onnx.export` (README, \"Your own model\"). To load this "
    "file yourself in a custom engine's preprocess.py, upload it with --framework custom")
EXPORT_TO_ONNX = "the platform serves ONNX: export the model to ONNX first, then upload the .onnx file. " + _HOW_TO_EXPORT
_CHECKPOINT = "a PyTorch checkpoint (torch.save)"
_TORCHSCRIPT = "a TorchScript archive (torch.jit.save)"
_PROGRAM = "a PyTorch exported program (torch.export.save)"
_SERVED = ("exported to ONNX where onnxruntime agrees with torch, else served with torch in the worker "
           "(docs/torchserve.md#plain-pytorch-files)")
# what each kind of PyTorch file needs to be served; safetensors files and folders: EXPORT_TO_ONNX
_HOW_TO_SERVE = {
    _CHECKPOINT: ("a state dict is served with the Python file defining its nn.Module class: `serving model upload "
                  f"--path FILE --model-file model.py --input-size 3 32 32 [--input-type float32]`, {_SERVED}"),
    _TORCHSCRIPT: (f"`serving model upload --path FILE --input-size 3 32 32` uploads it, {_SERVED}; through the API, "
                   "register it as framework torchscript"),
    _PROGRAM: f"`serving model upload --path FILE.pt2` uploads it, {_SERVED}; through the API, register it as "
              "framework torch-export",
}
# torch.save's legacy (non-zip) format: a protocol-2 pickle of this magic number comes first
_TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19."
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                 "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def pytorch_kind(path: Path) -> str | None:
    """What kind of PyTorch/safetensors file ``path`` is (in words), or None when it is none of them."""
    path = Path(path)
    if path.is_dir():
        if (path / "config.json").exists() and any((path / name).exists() for name in _WEIGHT_FILES):
            return "a Hugging Face model folder"
        if any(p.suffix in (".safetensors", ".bin", ".pt", ".pth") for p in path.iterdir()):
            return "a folder of PyTorch weights"
        return None
    with open(path, "rb") as f:
        head = f.read(4096)
    if head.startswith(_TORCH_LEGACY_MAGIC):
        return _CHECKPOINT
    if head.startswith(b"PK\x03\x04"):
        return _torch_zip_kind(path)
    if _is_safetensors(head, path.stat().st_size):
        return "a safetensors file"
    return None


def _torch_zip_kind(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return None
    if is_exported_program(path):
        return _PROGRAM
    if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return None
    if any(n.endswith("/constants.pkl") for n in names):
        return _TORCHSCRIPT
    return _CHECKPOINT


def _is_safetensors(head: bytes, size: int) -> bool:
    """safetensors: an 8-byte little-endian header length, then that many bytes of JSON."""
    if len(head) < 10:
        return False
    length = int.from_bytes(head[:8], "little")
    if not 2 <= length <= size - 8 or head[8:9] != b"{":
        return False
    if length > len(head) - 8:
        return True  # a header longer than what was read: its start is enough
    try:
        return isinstance(json.loads(head[8:8 + length]), dict)
    except ValueError:
        return False


def refuse_pytorch(path: Path, framework: str, label: str = "the upload") -> None:
    """SignatureError (a 422) with the way to serve the file, unless ``framework`` is ``custom`` (user
    code may load any file it likes) or one of engine torch's (serving/pytorch/kinds.py)."""
    if framework == "custom" or framework in TORCH_FRAMEWORKS:
        return
    kind = pytorch_kind(path)
    if kind in _HOW_TO_SERVE:
        raise SignatureError(f"{label} is {kind}; {_HOW_TO_SERVE[kind]}. Or export it to ONNX yourself. "
                             f"{_HOW_TO_EXPORT}")
    if kind is not None:
        raise SignatureError(f"{label} is {kind}; {EXPORT_TO_ONNX}")


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

"""The model formats Triton serves, as the registry names them, and how a file tells which it is.

A Triton user's repository holds ONNX files, TensorRT plans, TorchScript archives, TensorFlow
SavedModels, OpenVINO IR and Python-backend models; each has a backend (and, for some, a
platform name) in config.pbtxt and a default file name in the version directory. The registry
stores the format as the model version's ``framework`` (no column of its own): ``onnx``,
``tensorrt``, ``torchscript``, ``savedmodel``, ``openvino``, ``python``.

Which Triton serves them: the embedded one (`serving up`, `serving triton`: the tritonserver
of nvidia-pytriton, whose one backend is Python) runs ONNX models (through onnxruntime inside
the Python backend) and Python-backend models; every format runs on an external Triton
(NVIDIA's image), whose repository the control plane writes when ``SERVING_TRITON_MODEL_REPOSITORY``
is set. That setting is the rule the registry goes by (``servable_formats``).
"""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TritonFormat:
    name: str  # the registry's framework value
    backend: str  # config.pbtxt ``backend``
    platform: str  # config.pbtxt ``platform`` ("" where Triton names none)
    filename: str  # Triton's default model file (or folder) name in the version directory
    words: str  # how messages name it


FORMATS: dict[str, TritonFormat] = {f.name: f for f in (
    TritonFormat("onnx", "onnxruntime", "onnxruntime_onnx", "model.onnx", "an ONNX model"),
    TritonFormat("tensorrt", "tensorrt", "tensorrt_plan", "model.plan", "a TensorRT plan"),
    TritonFormat("torchscript", "pytorch", "pytorch_libtorch", "model.pt", "a TorchScript model"),
    TritonFormat("savedmodel", "tensorflow", "tensorflow_savedmodel", "model.savedmodel", "a TensorFlow SavedModel"),
    TritonFormat("openvino", "openvino", "", "model.xml", "an OpenVINO model"),
    TritonFormat("python", "python", "", "model.py", "a Python-backend model"),
)}
TRITON_ONLY = tuple(n for n in FORMATS if n != "onnx")  # formats only engine triton serves
EMBEDDED_FORMATS = ("onnx", "python")  # ONNX runs through onnxruntime inside the Python backend
EMBEDDED_BACKENDS = ("python",)
# a platform Triton knows -> its backend (config.pbtxt may give either, or both)
PLATFORM_BACKEND = {"tensorrt_plan": "tensorrt", "pytorch_libtorch": "pytorch", "onnxruntime_onnx": "onnxruntime",
                    "tensorflow_savedmodel": "tensorflow", "tensorflow_graphdef": "tensorflow"}
EXTERNAL_WAY = ("run an external Triton (NVIDIA's tritonserver image, deploy/docker-compose.yml or the Helm "
                "chart) and set SERVING_TRITON_MODEL_REPOSITORY on the control plane (docs/serving.md, "
                "\"What a Triton user can bring\")")


def format_named(platform: str = "", backend: str = "") -> TritonFormat | None:
    """The format a config.pbtxt's (or ClearML's --aux-config) platform/backend names; None if unknown."""
    backend = (backend or "").strip().strip("\"'") or PLATFORM_BACKEND.get((platform or "").strip().strip("\"'"), "")
    return next((f for f in FORMATS.values() if f.backend == backend), None)


def target_format(framework: str | None, triton_config: dict | None = None) -> TritonFormat | None:
    """A deployed model's format: its own (the registry's framework), else the one the endpoint's
    config.pbtxt fields name (ClearML's ``--aux-config platform=...`` on an upload of unknown format)."""
    if framework in FORMATS:
        return FORMATS[framework]
    tc = triton_config or {}
    return format_named(str(tc.get("platform") or ""), str(tc.get("backend") or "")) if tc else None


def servable_formats(external_triton: bool) -> tuple[str, ...]:
    return tuple(FORMATS) if external_triton else EMBEDDED_FORMATS


def unservable_message(fmt: TritonFormat, model_ref: str) -> str:
    """The 422 for a format the embedded Triton has no backend for: the format, its backends, the way."""
    return (f"{model_ref} is {fmt.words} (Triton backend {fmt.backend!r}); the embedded Triton has only the "
            f"{', '.join(EMBEDDED_BACKENDS)} backend, so it runs ONNX and Python-backend models. To serve "
            f"{fmt.words}, {EXTERNAL_WAY}")


def is_torchscript(path: Path) -> bool:
    """torch.jit.save writes a zip holding ``constants.pkl`` beside ``data.pkl`` (registry/signature.py
    tells it from a torch.save checkpoint the same way)."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return any(n.endswith("/constants.pkl") for n in names) and any(n.endswith("data.pkl") for n in names)


def is_python_model(path: Path) -> bool:
    try:
        return path.suffix == ".py" and "TritonPythonModel" in path.read_text(errors="replace")
    except OSError:
        return False


def is_openvino(path: Path) -> bool:
    """An OpenVINO IR: ``model.xml`` (the graph, ``<net ...>``) with its weights ``model.bin`` beside it."""
    try:
        head = path.read_bytes()[:4096].decode("utf-8", errors="replace")
    except OSError:
        return False
    return path.suffix == ".xml" and "<net" in head and path.with_suffix(".bin").is_file()


def is_model_folder(path: Path) -> bool:
    """A Triton model folder: ``config.pbtxt`` and/or numbered version directories."""
    return path.is_dir() and ((path / "config.pbtxt").is_file() or any(
        p.is_dir() and p.name.isdigit() for p in path.iterdir()))


def detect(path: Path) -> str | None:
    """The Triton format of a file or folder as a user has it, read from its content or name; None when
    it is none of them (then the caller's other rules apply: ONNX, scikit-learn, ...). A whole Triton
    model folder answers ``"folder"``: its config.pbtxt or version directory tells the format."""
    path = Path(path)
    if path.is_dir():
        if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
            return "savedmodel"
        return "folder" if is_model_folder(path) else None
    if path.suffix.lower() in (".plan", ".engine"):
        return "tensorrt"
    if is_openvino(path):
        return "openvino"
    if is_python_model(path):
        return "python"
    if is_torchscript(path):
        return "torchscript"
    return None

"""A Triton model as one artifact: packed by the CLI, read by the registry, laid out by the repository writers.

What a user has is a model folder (``config.pbtxt`` and version directories such as ``1/model.py``)
or one model file/folder (``model.plan``, ``model.pt``, ``model.savedmodel/``, ``model.xml`` +
``model.bin``, ``model.py``). Either travels as one deterministic tar.gz (same files, same hash)
holding ``config.pbtxt`` when there is one and the model's files under ``1/``: the registry
numbers versions itself, so the folder's newest version directory becomes ``1``. A single-file
format may also be uploaded as the bare file (the API's way): it is placed as ``1/<Triton's default
file name>`` when written out.

Inputs and outputs come from config.pbtxt (read strictly against Triton's protobuf schema, as
repository.py checks what it writes), in the registry's signature form: whole shapes, the batch
dimension included as -1 when ``max_batch_size > 0``, plus that ``max_batch_size``, which the model's
own config fixes (the worker never sends it bigger batches: serving/triton/shapes.py).
"""
from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.triton.auto_complete import Unreadable, declared_tensors
from serving.triton.model_formats import FORMATS, TritonFormat, format_named, is_model_folder, is_torchscript

VERSION_DIR = "1"
CONFIG = "config.pbtxt"


class ConfigError(ValueError):
    """A config.pbtxt that Triton would refuse."""


class ModelFolderError(ConfigError):
    """The upload is not the Triton model it says it is (the control plane answers 422 with it)."""


# --- packing (CLI) ---------------------------------------------------------------------------------
def newest_version_dir(folder: Path) -> Path | None:
    versions = sorted((p for p in folder.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return versions[-1] if versions else None


def folder_format(folder: Path) -> TritonFormat:
    """A model folder's format: its config.pbtxt's backend/platform, else the files in its newest version."""
    cfg = parse_config((folder / CONFIG).read_text()) if (folder / CONFIG).is_file() else None
    if cfg is not None and (cfg.platform or cfg.backend):
        fmt = format_named(cfg.platform, cfg.backend)
        if fmt is None:
            raise ModelFolderError(f"{folder / CONFIG} names platform {cfg.platform!r} / backend {cfg.backend!r}; "
                                   f"the formats known here: {', '.join(FORMATS)}")
        return fmt
    version = newest_version_dir(folder)
    found = [f for f in FORMATS.values() if version is not None and (version / model_file(f, cfg)).exists()]
    if not found:
        raise ModelFolderError(f"{folder} has no config.pbtxt and no version directory holding one of "
                               f"{', '.join(f.filename for f in FORMATS.values())}")
    return found[0]


def _add(tar: tarfile.TarFile, src: Path, arcname: str) -> None:
    for path in [src, *sorted(src.rglob("*"))] if src.is_dir() else [src]:
        name = arcname if path == src else f"{arcname}/{path.relative_to(src).as_posix()}"
        info = tar.gettarinfo(str(path), arcname=name)
        info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
        if path.is_dir():
            tar.addfile(info)
        elif path.is_file():
            with open(path, "rb") as f:
                tar.addfile(info, f)


def pack(path: Path, fmt: TritonFormat) -> bytes:
    """The artifact for a model folder, or for one model file/folder of ``fmt`` (OpenVINO: the .xml
    with its .bin)."""
    path = Path(path)
    entries: list[tuple[Path, str]] = []
    if is_model_folder(path) and not (path / "saved_model.pb").exists():
        version = newest_version_dir(path)
        for child in sorted(path.iterdir()):
            if child == version:
                entries.append((child, VERSION_DIR))
            elif not (child.is_dir() and child.name.isdigit()):  # other versions stay behind
                entries.append((child, child.name))
    elif fmt.name == "openvino":
        entries = [(path, f"{VERSION_DIR}/model.xml"), (path.with_suffix(".bin"), f"{VERSION_DIR}/model.bin")]
    else:
        entries = [(path, f"{VERSION_DIR}/{fmt.filename}")]
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            for src, arcname in entries:
                _add(tar, src, arcname)
    return buf.getvalue()


# --- reading (registry) --------------------------------------------------------------------------
def parse_config(text: str) -> mc.ModelConfig:
    """Parse strictly (unknown fields and bad enums fail) and check what Triton checks at load, but for
    the name and backend, which a model folder may leave to Triton (its directory, its model file)."""
    cfg = mc.ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as exc:
        raise ModelFolderError(f"config.pbtxt does not match Triton's schema: {exc}") from None
    if cfg.max_batch_size < 0:
        raise ModelFolderError("max_batch_size must be >= 0")
    for tensor in [*cfg.input, *cfg.output]:
        if not tensor.name or tensor.data_type == mc.TYPE_INVALID or not tensor.dims:
            raise ModelFolderError(f"tensor {tensor.name!r} needs a name, a data_type and dims")
    if any(s > cfg.max_batch_size for s in cfg.dynamic_batching.preferred_batch_size):
        raise ModelFolderError("preferred_batch_size above max_batch_size")
    return cfg


def is_archive(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b" and tarfile.is_tarfile(path)


def _archive_names(path: Path) -> tuple[list[str], str | None]:
    with tarfile.open(path) as tar:
        names = [m.name.removeprefix("./") for m in tar.getmembers()]
        member = tar.extractfile(CONFIG) if CONFIG in names else None
        text = member.read().decode("utf-8", errors="replace") if member is not None else None
    return names, text


def model_file(fmt: TritonFormat, cfg: mc.ModelConfig | None) -> str:
    return (cfg.default_model_filename if cfg is not None and cfg.default_model_filename else "") or fmt.filename


def describe(path: Path, framework: str) -> dict[str, Any]:
    """Check an uploaded artifact is a ``framework`` model Triton can load; its signature (from
    config.pbtxt; empty without one: an external Triton auto-completes where its backend can)."""
    fmt = FORMATS[framework]
    if not is_archive(path):
        return _describe_file(Path(path), fmt)
    names, text = _archive_names(path)
    cfg = parse_config(text) if text is not None else None
    if cfg is not None and (cfg.platform or cfg.backend):
        named = format_named(cfg.platform, cfg.backend)
        if named is None or named.name != fmt.name:
            raise ModelFolderError(f"its config.pbtxt names platform {cfg.platform!r} / backend {cfg.backend!r}, "
                                   f"not {fmt.words} (backend {fmt.backend!r})")
    wanted = [model_file(fmt, cfg)] + (["model.bin"] if fmt.name == "openvino" else [])
    missing = [w for w in wanted if not any(n == f"{VERSION_DIR}/{w}" or n.startswith(f"{VERSION_DIR}/{w}/")
                                            for n in names)]
    if missing:
        raise ModelFolderError(f"{fmt.words} folder needs {', '.join(f'{VERSION_DIR}/{m}' for m in missing)} "
                               f"(it holds {', '.join(sorted(names)[:10]) or 'nothing'})")
    if cfg is not None and (cfg.input or cfg.output or fmt.name != "python"):
        return signature_from_config(cfg)
    return _declared(fmt, _archive_file(path, f"{VERSION_DIR}/{wanted[0]}"))


def _archive_file(path: Path, name: str) -> bytes | None:
    with tarfile.open(path) as tar:
        member = tar.extractfile(name) if name in tar.getnames() else None
        return member.read() if member is not None else None


def _declared(fmt: TritonFormat, source: bytes | None) -> dict[str, Any]:
    """No tensors in a config.pbtxt (or none at all): a Python-backend model.py may declare them in its
    ``auto_complete_config`` (serving/triton/auto_complete.py). What cannot be read is kept as the reason,
    for the control plane's answer at deploy."""
    empty: dict[str, Any] = {"inputs": [], "outputs": []}
    if fmt.name != "python" or source is None:
        return empty
    try:
        return declared_tensors(source.decode("utf-8", errors="replace")) or empty
    except Unreadable as exc:
        return {**empty, "auto_complete": str(exc)}


def _describe_file(path: Path, fmt: TritonFormat) -> dict[str, Any]:
    if fmt.name in ("savedmodel", "openvino"):
        raise ModelFolderError(f"{fmt.words} is several files: upload its folder (serving model upload --path)")
    if fmt.name == "python" and b"TritonPythonModel" not in path.read_bytes():
        raise ModelFolderError("a Python-backend model.py defines class TritonPythonModel; this file does not")
    if fmt.name == "torchscript" and not is_torchscript(path):
        raise ModelFolderError("not a TorchScript archive (torch.jit.save writes one)")
    if path.stat().st_size == 0:
        raise ModelFolderError("the model file is empty")
    return _declared(fmt, path.read_bytes())


def _dtype(value: int) -> str:
    name = mc.DataType.Name(value).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _shape(tensor: Any, batched: bool) -> list[int]:
    dims = [int(d) for d in (tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)]
    return [-1, *dims] if batched else dims


def signature_from_config(cfg: mc.ModelConfig) -> dict[str, Any]:
    """The registry's signature (whole shapes, as the model sees them after any ``reshape``)."""
    batched = cfg.max_batch_size > 0
    return {"inputs": [{"name": t.name, "dtype": _dtype(t.data_type), "shape": _shape(t, batched)} for t in cfg.input],
            "outputs": [{"name": t.name, "dtype": _dtype(t.data_type), "shape": _shape(t, batched)}
                        for t in cfg.output],
            "max_batch_size": int(cfg.max_batch_size)}


# --- laying out (repository writers) ----------------------------------------------------------------
def unpack(artifact: Path, model_dir: Path) -> str | None:
    """Extract a model-folder archive into ``model_dir`` (``1/...``); the config.pbtxt text it holds, if any."""
    model_dir.mkdir(parents=True, exist_ok=True)
    with tarfile.open(artifact) as tar:
        tar.extractall(model_dir, filter="data")
    config = model_dir / CONFIG
    return config.read_text() if config.exists() else None

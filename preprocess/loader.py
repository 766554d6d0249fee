"""Build an endpoint's processor from its snapshot ``preprocess`` entry and fetched artifacts."""
from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path
from typing import Any, Callable

from preprocess.base import Processor
from preprocess.encoder import EncoderProcessor, is_encoder
from preprocess.handler import HandlerProcessor
from preprocess.passthrough import PassthroughProcessor
from preprocess.tokenizer import TokenizerProcessor
from preprocess.requirements import ensure_installed
from preprocess.user_code import UserCodeError, UserContext, UserProcessor
from serving.unpacked import unpack_once


# A tokenizer never reads model weights: an exporter's output folder (model.onnx beside the
# tokenizer files, as optimum-cli writes it) or a Hugging Face model folder packs without them.
_WEIGHT_SUFFIXES = frozenset({".onnx", ".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".ot", ".gguf"})


def pack_directory(path: Path) -> bytes:
    """A tar.gz of the directory's files (model weights left out) with times and owners zeroed:
    same files, same hash."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w") as tar:
            for file in sorted(p for p in path.iterdir() if p.is_file() and p.suffix not in _WEIGHT_SUFFIXES):
                info = tar.gettarinfo(str(file), arcname=file.name)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                with open(file, "rb") as f:
                    tar.addfile(info, f)
    return buf.getvalue()


def unpack_tokenizer(archive: Path, dest_root: Path) -> Path:
    """Tokenizer directories travel as a tar.gz; unpack once per content hash (serving/unpacked.py)."""
    return unpack_once(archive, dest_root, _untar)


def _untar(archive: Path, dest: Path) -> None:
    with tarfile.open(archive) as tar:
        _extract_safely(tar, dest)


def _extract_safely(tar: tarfile.TarFile, dest: Path) -> None:
    """Regular files inside ``dest`` only: ``filter="data"`` where this Python has it (3.11.4+), the same
    rule by hand on older ones (Debian 12's 3.11.2), never a path out of ``dest`` or a link."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = dest.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        if not member.isfile() or root not in target.parents:
            raise UserCodeError(f"tokenizer archive member {member.name!r} is not a plain file inside the archive")
        tar.extract(member, root)


def build_processor(spec: dict[str, Any], artifact_path: Callable[[str], Path], unpack_root: Path,
                    context: UserContext | None = None) -> Processor:
    """``context``: what user code gets from the worker (model file for ``load``, ``send_request``)."""
    kind = spec.get("kind") or "none"
    options = spec.get("options") or {}
    if kind == "tokenizer":
        built = EncoderProcessor if is_encoder(options) else TokenizerProcessor  # embeddings / rerank, or labels
        return built.from_options(unpack_tokenizer(artifact_path(spec["artifact"]), unpack_root), options)
    if kind == "user":
        ensure_installed(list(options.get("requirements") or []), unpack_root.parent / "packages")
        if options.get("timeout_s") and context is not None:
            context.timeout_s = float(options["timeout_s"])
        return UserProcessor(artifact_path(spec["artifact"]), context)
    if kind == "none":
        return PassthroughProcessor()
    if kind == "handler":  # the engine's handler does it all (a TorchServe archive's)
        return HandlerProcessor()
    raise UserCodeError(f"unknown preprocess kind {kind!r}")

"""A Hugging Face model folder as one content-addressed artifact: a plain tar written deterministically.

Same files, same bytes, same sha256: names sorted, times, owners and modes zeroed. The tar is produced
as a stream of chunks whose total size is known before the first byte, so the CLI shows progress and
never holds a multi-gigabyte weight file in memory (nor writes a second copy of it to disk). Not
compressed: safetensors weights do not compress, and an uncompressed tar is read by seeking
(``config.json`` of a 10 GB model is found without reading the weights).
"""
from __future__ import annotations

import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

BLOCK = 512
CHUNK = 1 << 20


@dataclass(frozen=True)
class FolderArchive:
    size: int                     # bytes of the whole tar, known before streaming
    files: list[tuple[str, Path]]  # (name in the archive, file on disk), in archive order

    def chunks(self) -> Iterator[bytes]:
        for name, path in self.files:
            yield _header(name, path.stat().st_size)
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    yield chunk
            yield b"\0" * _padding(path.stat().st_size)
        yield b"\0" * (2 * BLOCK)


def _header(name: str, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = size, 0, 0o644, 0, 0, "", ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _padding(size: int) -> int:
    return -size % BLOCK


def folder_files(path: Path) -> list[tuple[str, Path]]:
    """Every regular file under ``path`` by its relative name, sorted; hidden files and folders
    (``.git``, ``.cache``, a builder's stamp) and links are left out."""
    found = []
    for file in path.rglob("*"):
        rel = file.relative_to(path)
        if any(part.startswith(".") for part in rel.parts) or file.is_symlink() or not file.is_file():
            continue
        found.append((rel.as_posix(), file))
    return sorted(found)


def archive_folder(path: Path) -> FolderArchive:
    files = folder_files(path)
    size = sum(len(_header(name, f.stat().st_size)) + f.stat().st_size + _padding(f.stat().st_size)
               for name, f in files) + 2 * BLOCK
    return FolderArchive(size, files)


class FolderError(ValueError):
    """The artifact is not a Hugging Face model folder the platform can read."""


@dataclass(frozen=True)
class FolderContents:
    names: list[str]
    config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    chat_template_file: bool


def read_archive(archive: Path) -> FolderContents:
    """The file names, config.json and tokenizer_config.json of an uploaded folder archive."""
    try:
        with tarfile.open(archive, "r:") as tar:
            names = [m.name for m in tar.getmembers() if m.isfile()]
            config = _json_member(tar, "config.json")
            tokenizer_config = _json_member(tar, "tokenizer_config.json") if "tokenizer_config.json" in names else {}
    except tarfile.TarError as exc:
        raise FolderError(f"not a model folder uploaded by `serving model upload --path FOLDER` ({exc})") from None
    if config is None:
        raise FolderError("the folder has no config.json: give a Hugging Face model folder (save_pretrained's output)")
    chat_file = any(n in ("chat_template.jinja", "chat_template.json") for n in names)
    return FolderContents(names, config, tokenizer_config or {}, chat_file)


def _json_member(tar: tarfile.TarFile, name: str) -> dict[str, Any] | None:
    try:
        member = tar.getmember(name)
    except KeyError:
        return None
    raw = tar.extractfile(member)
    try:
        value = json.loads(raw.read()) if raw else None
    except ValueError as exc:
        raise FolderError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise FolderError(f"{name} is not a JSON object")
    return value

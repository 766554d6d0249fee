"""Content-addressed artifact store on disk: ``<root>/<sha[:2]>/<sha256>``.

Identical uploads are stored once, and a hash never changes meaning, so workers
can cache artifacts forever and the registry only stores hashes.
"""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import AsyncIterator

import psutil

from serving.artifact_client import shard_path

log = logging.getLogger(__name__)

HEX = set("0123456789abcdef")
UPLOAD_PREFIX = ".upload-"
STALE_TEMP_S = 6 * 3600  # a temp file this old is left over whoever wrote it


def is_sha256(text: str) -> bool:
    return len(text) == 64 and set(text) <= HEX


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.remove_interrupted_uploads()

    def _upload_prefix(self) -> str:
        """``.upload-<host>-<pid>-``: a restarted control plane can tell its dead predecessor's
        temp files from those of another replica uploading into the same shared directory."""
        host = socket.gethostname().replace("-", "_")[:64] or "host"
        return f"{UPLOAD_PREFIX}{host}-{os.getpid()}-"

    def remove_interrupted_uploads(self) -> list[Path]:
        """Temp files of uploads whose process died (kill -9, power loss) are never renamed into
        place; remove them at start: those of dead processes on this host, and any old one."""
        host = socket.gethostname().replace("-", "_")[:64] or "host"
        removed = []
        for path in [*self.root.glob(f"{UPLOAD_PREFIX}*"), *self.root.glob("??/*.tmp")]:
            parts = path.name[len(UPLOAD_PREFIX):].split("-") if path.name.startswith(UPLOAD_PREFIX) else []
            mine = len(parts) >= 3 and parts[0] == host and parts[1].isdigit()
            try:
                old = time.time() - path.stat().st_mtime > STALE_TEMP_S
                if old or (mine and not psutil.pid_exists(int(parts[1]))) or (path.name.startswith(UPLOAD_PREFIX)
                                                                         and len(parts) < 3):
                    path.unlink()
                    removed.append(path)
            except FileNotFoundError:
                continue
        if removed:
            log.warning("removed %d temp file(s) of interrupted uploads: %s", len(removed),
                        ", ".join(p.name for p in removed))
        return removed

    def path(self, sha256: str) -> Path:
        return shard_path(self.root, sha256)

    def exists(self, sha256: str) -> bool:
        return is_sha256(sha256) and self.path(sha256).exists()

    async def put_stream(self, chunks: AsyncIterator[bytes], max_bytes: int | None = None) -> tuple[str, int]:
        """Stream to a temp file while hashing, then rename into place (never half-written)."""
        digest, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=self._upload_prefix())
        try:
            with os.fdopen(fd, "wb") as f:
                async for chunk in chunks:
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise ValueError(f"artifact larger than {max_bytes} bytes")
                    digest.update(chunk)
                    f.write(chunk)
            sha = digest.hexdigest()
            dest = self.path(sha)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, dest)
            return sha, size
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def put_file(self, path: Path) -> tuple[str, int]:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        sha = digest.hexdigest()
        dest = self.path(sha)
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_suffix(".tmp")
            tmp.write_bytes(path.read_bytes())
            os.replace(tmp, dest)
        return sha, dest.stat().st_size

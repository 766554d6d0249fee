"""Content-addressed artifact store on disk: ``<root>/<sha[:2]>/<sha256>``.

Identical uploads are stored once, and a hash never changes meaning, so workers
can cache artifacts forever and the registry only stores hashes.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import AsyncIterator

from serving.artifact_client import shard_path

HEX = set("0123456789abcdef")


def is_sha256(text: str) -> bool:
    return len(text) == 64 and set(text) <= HEX


class ArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        return shard_path(self.root, sha256)

    def exists(self, sha256: str) -> bool:
        return is_sha256(sha256) and self.path(sha256).exists()

    async def put_stream(self, chunks: AsyncIterator[bytes], max_bytes: int | None = None) -> tuple[str, int]:
        """Stream to a temp file while hashing, then rename into place (never half-written)."""
        digest, size = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".upload-")
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

"""Fetch registry artifacts (model files, tokenizers, preprocess code) by content hash.

A process that shares the artifact directory with the control plane reads it in
place; one that does not (a worker pod) downloads once into its cache. Content
addressing makes the cache trivially correct: a hash never changes meaning.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import httpx


def shard_path(root: Path, sha256: str) -> Path:
    return root / sha256[:2] / sha256


class ArtifactFetcher:
    def __init__(self, control_plane_url: str, cache_dir: Path, shared_dir: Path | None = None) -> None:
        self.base = control_plane_url.rstrip("/")
        self.cache_dir = cache_dir
        self.shared_dir = shared_dir

    def path(self, sha256: str) -> Path:
        if self.shared_dir is not None:
            shared = shard_path(self.shared_dir, sha256)
            if shared.exists():
                return shared
        local = shard_path(self.cache_dir, sha256)
        if not local.exists():
            self._download(sha256, local)
        return local

    def _download(self, sha256: str, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        digest = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as f, httpx.stream(
                "GET", f"{self.base}/artifacts/{sha256}", timeout=60.0
            ) as resp:
                resp.raise_for_status()
                for chunk in resp.iter_bytes(1 << 20):
                    digest.update(chunk)
                    f.write(chunk)
            if digest.hexdigest() != sha256:
                raise ValueError(f"artifact {sha256} arrived corrupted")
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

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
from typing import Callable

import httpx

from serving.credentials import auth_headers, worker_token


def shard_path(root: Path, sha256: str) -> Path:
    return root / sha256[:2] / sha256


class ArtifactFetcher:
    def __init__(self, control_plane_url: str, cache_dir: Path, shared_dir: Path | None = None,
                 token: str | Callable[[], str | None] | None = None) -> None:
        self.base = control_plane_url.rstrip("/")
        # the worker token: given, or SERVING_WORKER_TOKEN / $SERVING_HOME/tokens/worker at each download
        self._token = token if token is not None else worker_token
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
            token = self._token() if callable(self._token) else self._token
            with os.fdopen(fd, "wb") as f, httpx.stream(
                "GET", f"{self.base}/artifacts/{sha256}", timeout=60.0, headers=auth_headers(token)
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

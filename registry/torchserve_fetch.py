"""The archive a TorchServe registration names (``POST /models?url=...``), brought into the artifact store.

TorchServe takes two kinds of ``url``: a file name in its model store (``--model-store``; here
``SERVING_TORCHSERVE_MODEL_STORE``), and an http(s) URL it downloads. Both are read here within the
control plane's upload limit (``SERVING_MAX_ARTIFACT_BYTES``) and the calling token's upload quota, as
an upload to ``POST /artifacts`` would be, and stored by content. A name that leads out of the model
store (a sub-folder, ``..``, an absolute path, a link pointing elsewhere) is refused: the management
API must not become a way to read the control plane's files.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from starlette.concurrency import run_in_threadpool

from registry.artifacts import ArtifactStore
from registry.auth import Principal, TokenStore
from registry.torchserve_models import bad_request

DOWNLOAD_TIMEOUT_S = httpx.Timeout(30.0, read=300.0)  # a slow server, not a big file, is what times out


@dataclass(frozen=True)
class Fetched:
    sha256: str
    size: int


@dataclass(frozen=True)
class Limits:
    """How much one registration may store: the control plane's limit and what the token's quota leaves."""

    max_bytes: int
    quota_left: int | None = None

    @classmethod
    def of(cls, max_bytes: int, principal: Principal | None) -> "Limits":
        if principal is None or principal.upload_quota_bytes is None:
            return cls(max_bytes)
        return cls(max_bytes, max(0, principal.upload_quota_bytes - principal.uploaded_bytes))

    @property
    def cap(self) -> int:
        return self.max_bytes if self.quota_left is None else min(self.max_bytes, self.quota_left)

    def refusal(self, what: str) -> str:
        if self.quota_left is not None and self.quota_left < self.max_bytes:
            return f"{what} is larger than the upload quota this token has left ({self.quota_left} bytes)"
        return f"{what} is larger than the limit of {self.max_bytes} bytes (SERVING_MAX_ARTIFACT_BYTES)"


def is_remote(url: str) -> bool:
    return urlsplit(url).scheme.lower() in ("http", "https")


def shown_url(url: str) -> str:
    """The url as kept with the version (TorchServe's ``modelUrl``): a download's credentials, in its user part
    or its query (a presigned URL's signature), are not kept where every reader sees them."""
    if not is_remote(url):
        return url
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")
    return parts._replace(netloc=netloc, query="", fragment="").geturl()


def store_file(model_store: Path, url: str) -> Path:
    """The model store's file a plain ``url`` names; anything outside the store is a 400."""
    if not url or url in (".", "..") or Path(url).name != url or "\\" in url or "\x00" in url:
        raise bad_request(f"url {url!r} must be an http(s) URL or the file name of an archive directly in the "
                          "model store (SERVING_TORCHSERVE_MODEL_STORE), not a path")
    if urlsplit(url).scheme:
        raise bad_request(f"url {url!r}: only http and https URLs are downloaded; put the archive in the model "
                          "store and give its file name")
    root = model_store.resolve()
    path = (root / url).resolve()
    if path.parent != root:
        raise bad_request(f"url {url!r} leads out of the model store (SERVING_TORCHSERVE_MODEL_STORE)")
    if not path.is_file():
        raise bad_request(f"Model store file not found: {url} (model store {model_store})")
    return path


async def fetch(url: str, store: ArtifactStore, model_store: Path, limits: Limits) -> Fetched:
    """The archive ``url`` names, stored by content (not yet charged to any quota)."""
    if is_remote(url):
        return await _download(url, store, limits)
    path = store_file(model_store, url)
    if path.stat().st_size > limits.cap:
        raise bad_request(limits.refusal(f"the archive {url}"))
    sha, size = await run_in_threadpool(store.put_file, path)
    return Fetched(sha, size)


async def _download(url: str, store: ArtifactStore, limits: Limits) -> Fetched:
    """Streamed into the store while counting: a server that sends more than it declared is cut off too."""
    try:
        async with httpx.AsyncClient(follow_redirects=True, timeout=DOWNLOAD_TIMEOUT_S) as client:
            async with client.stream("GET", url) as answer:
                if answer.status_code != 200:
                    raise bad_request(f"Failed to download archive from: {url} (HTTP {answer.status_code})")
                declared = answer.headers.get("content-length", "")
                if declared.isdigit() and int(declared) > limits.cap:
                    raise bad_request(limits.refusal(f"the archive at {url}"))
                try:
                    sha, size = await store.put_stream(answer.aiter_bytes(), max_bytes=limits.cap)
                except ValueError:
                    raise bad_request(limits.refusal(f"the archive at {url}")) from None
    except httpx.HTTPError as exc:
        raise bad_request(f"Failed to download archive from: {url} ({type(exc).__name__}: {exc})") from None
    return Fetched(sha, size)


async def charge(tokens: TokenStore, principal: Principal | None, fetched: Fetched, limits: Limits) -> None:
    """Count the stored bytes against the token's quota, as ``POST /artifacts`` does; a 400 past it."""
    if principal is None:
        return
    if not await run_in_threadpool(tokens.charge_upload, principal.id, fetched.size):
        raise bad_request(limits.refusal("the archive"))

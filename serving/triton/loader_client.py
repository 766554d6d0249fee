"""A worker's side of the embedded Triton's load-on-demand endpoint (serving/triton/loader_http.py).

Under a memory budget a deployed model may be cold: not loaded in Triton, but loadable. The
worker's triton engine asks here (a) whether a model Triton does not hold is such a model, so the
readiness gate does not hold its endpoint back, and (b) to load it for a request that found it
cold, waiting for the load. Without a budget nothing listens there: the first refused
connection makes the client stay quiet for ``ABSENT_S``, so an engine without a budget pays
nothing for asking.
"""
from __future__ import annotations

import time
from typing import Callable

import httpx

from serving.credentials import auth_headers

ABSENT_S = 5.0  # after a refused connection, answer "not loadable" without asking for this long
LOADABLE = {"loaded", "cold", "loading"}


class ColdLoadError(RuntimeError):
    """The loader answered but could not load the model now; ``retry_after_s`` when worth retrying."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class LoaderClient:
    def __init__(self, url: str, token: Callable[[], str | None]) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self._absent_until = 0.0
        self._async: httpx.AsyncClient | None = None

    def _absent(self) -> bool:
        return time.monotonic() < self._absent_until

    def _gone(self) -> None:
        self._absent_until = time.monotonic() + ABSENT_S

    def loadable(self, name: str) -> bool:
        """Blocking (the readiness gate runs in the config thread): is ``name`` deployed in the
        embedded Triton and loadable on demand?"""
        if self._absent():
            return False
        try:
            r = httpx.get(f"{self.url}/models/{name}", headers=auth_headers(self.token()), timeout=2.0)
        except httpx.HTTPError:
            self._gone()
            return False
        return _loadable(r)

    async def aloadable(self, name: str) -> bool:
        if self._absent():
            return False
        try:
            r = await self._client().get(f"{self.url}/models/{name}", headers=auth_headers(self.token()),
                                         timeout=2.0)
        except httpx.HTTPError:
            self._gone()
            return False
        return _loadable(r)

    async def ensure(self, name: str, timeout_s: float) -> bool:
        """Have ``name`` loaded; True once it is, False when no loader knows it (no budget here,
        or not a model it can load). Raises ColdLoadError when the loader could not load it now."""
        if self._absent():
            return False
        try:
            r = await self._client().post(f"{self.url}/models/{name}/load", params={"timeout_s": timeout_s},
                                          headers=auth_headers(self.token()), timeout=timeout_s + 5.0)
        except (httpx.ConnectError, httpx.ConnectTimeout):  # no loader (no budget): not a cold model
            self._gone()
            return False
        except httpx.HTTPError as exc:
            raise ColdLoadError(f"loading {name} on demand failed: {exc!r}", retry_after_s=1.0) from None
        if r.status_code == 200:
            return True
        if r.status_code in (401, 404):
            return False
        detail = _detail(r)
        retry = r.headers.get("Retry-After")
        raise ColdLoadError(detail, retry_after_s=float(retry) if retry else None)

    def _client(self) -> httpx.AsyncClient:
        if self._async is None:
            self._async = httpx.AsyncClient()
        return self._async

    async def close(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None


def _loadable(r: httpx.Response) -> bool:
    try:
        body = r.json()
    except ValueError:
        return False
    return r.status_code == 200 and body.get("loadable") is True and body.get("state") in LOADABLE


def _detail(r: httpx.Response) -> str:
    try:
        return str(r.json().get("detail") or r.text)
    except ValueError:
        return r.text[:300]

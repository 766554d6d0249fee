"""How the worker's Triton engine reaches Triton: one server, or several (serving/worker/engines/triton_pool.py).

The engine (serving/worker/engines/triton.py) builds its requests and hands each call to a
``channels`` object as a function of a ``tritonclient.grpc.aio`` client; the channels object
decides which server runs it. ``OneTriton`` is the single-address path as it always was: one
client (one HTTP/2 channel) per worker process, created inside the process's event loop on first
use and reused by every request; gRPC reconnects it by itself, so when Triton comes back requests
succeed again without a restart, and meanwhile each failure is a 503 with ``Retry-After``.

``TRITON_GRPC_URL`` chooses (``channels_for`` in triton.py): ``host:port`` is one server; ``h1:p1,h2:p2`` a
fixed list; ``dns:///name:port`` every address the name resolves to (a Kubernetes headless
Service: one per ready Triton pod), resolved again every few seconds.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, TypeVar

import tritonclient.grpc.aio as grpc_aio
from tritonclient.utils import InferenceServerException

from serving.worker.errors import BadGateway, BadRequest, ModelNotReady, Unavailable, brief

T = TypeVar("T")
Call = Callable[[grpc_aio.InferenceServerClient], Awaitable[T]]

_MODEL_MISSING = ("unknown model", "is not ready", "not found", "no version is available")
_UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "failed to connect", "Socket closed")
DNS_PREFIX = "dns:///"


def classify(exc: InferenceServerException, url: str, model: str) -> Exception:
    status, message = str(exc.status() or ""), str(exc.message() or exc)
    if any(s in message for s in _MODEL_MISSING):
        return ModelNotReady(f"model {model} is not loaded in Triton yet")
    if any(s in status or s in message for s in _UNREACHABLE):
        return Unavailable(f"Triton at {url} is unreachable ({status or message})")
    if "INVALID_ARGUMENT" in status:
        return BadRequest(f"Triton rejected the request for {model}: {brief(message)}")
    return BadGateway(f"Triton failed on {model}: {brief(message)}")


async def call_on(client: grpc_aio.InferenceServerClient, url: str, model: str, call: Call[T]) -> T:
    """Run ``call`` on one server, its failures turned into the worker's errors."""
    try:
        return await call(client)
    except InferenceServerException as exc:
        raise classify(exc, url, model) from None
    except (OSError, asyncio.TimeoutError) as exc:
        raise Unavailable(f"Triton at {url} is unreachable ({exc})") from None


def model_ready_sync(clients: dict[str, Any], lock: threading.Lock, url: str, name: str) -> bool | None:
    """Blocking model-ready check (the readiness gate runs in the config thread, no event loop
    there) with a cached blocking client per address; None when the server did not answer."""
    import tritonclient.grpc as grpc_sync

    with lock:
        client = clients.get(url)
        if client is None:
            client = clients[url] = grpc_sync.InferenceServerClient(url)
    try:
        return bool(client.is_model_ready(name, client_timeout=2.0))
    except Exception:
        return None


class OneTriton:
    """One Triton server: every call goes to it, over one channel."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._client: grpc_aio.InferenceServerClient | None = None
        self._sync_clients: dict[str, Any] = {}
        self._sync_lock = threading.Lock()

    def client(self) -> grpc_aio.InferenceServerClient:
        if self._client is None:
            self._client = grpc_aio.InferenceServerClient(self.url)
        return self._client

    async def run(self, model: str, call: Call[T]) -> T:
        return await call_on(self.client(), self.url, model, call)

    async def model_ready(self, name: str) -> bool:
        try:
            return bool(await self.client().is_model_ready(name, client_timeout=2.0))
        except Exception:
            return False

    def model_ready_sync(self, name: str) -> bool:
        return bool(model_ready_sync(self._sync_clients, self._sync_lock, self.url, name))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

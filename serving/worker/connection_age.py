"""Close a client's HTTP connection once it is older than a set age, after an answer, never during one.

Why: a Kubernetes Service balances connections, not requests. A client that keeps its connections
alive stays on the pods it first reached, so workers added by the autoscaler get none of its requests
until it reconnects (measured on the test cluster: 16 keep-alive clients stayed on the first worker
after 3 more were ready, at twice the latency). With ``SERVING_WORKER_MAX_CONNECTION_AGE_S`` set, the
first answer on a connection past that age carries ``Connection: close``; uvicorn then closes it once
the answer is written, and the client's next request opens a new connection, which the Service may
send to any ready pod (gRPC servers do the same with MAX_CONNECTION_AGE). HTTP clients (httpx,
requests, curl) read that header and do not reuse the connection, so no request is lost to it.

A connection is known by its peer's address and port, which are its own while it is open.
"""
from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

Scope = dict[str, Any]
Message = dict[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]


class ConnectionAge:
    def __init__(self, app: ASGIApp, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.app, self.max_age_s, self.clock = app, max_age_s, clock
        self._known: dict[tuple, tuple[float, float]] = {}  # each connection: (first seen, last request)
        self._pruned = clock()

    async def __call__(self, scope: Scope, receive, send) -> None:
        peer = scope.get("client")
        if scope["type"] != "http" or self.max_age_s <= 0 or not peer:
            await self.app(scope, receive, send)
            return
        now = self.clock()
        key = tuple(peer)
        opened = self._known.get(key, (now, now))[0]
        self._known[key] = (opened, now)
        self._prune(now)  # after this connection's own time was set: it is never the one forgotten
        if now - opened < self.max_age_s:
            await self.app(scope, receive, send)
            return
        self._known.pop(key, None)  # the next request on this address and port is a new connection

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)

    def _prune(self, now: float) -> None:
        """Forget connections without a request for a while (most were closed by their clients), at most
        once per age. By their last request, not their opening: a connection open long and used again
        after a pause is still known, and closed after that answer."""
        if now - self._pruned < self.max_age_s:
            return
        self._pruned = now
        horizon = now - 4 * self.max_age_s
        for key in [k for k, (_, seen) in self._known.items() if seen < horizon]:
            del self._known[key]

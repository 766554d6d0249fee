"""Several uvicorn servers in one process, on one event loop: the control plane's API and TorchServe's
management API (registry/torchserve_api.py), which share one Registry and its in-memory state.

Why not two ``uvicorn.run``: each runs a loop of its own, and the second would have to live in another
thread with the shared objects crossing loops. Why not one app on two ports: uvicorn serves one app
per server. So the servers are started here on one loop, the first one first (its lifespan starts
what the others use: the config broadcaster, the rollout controller), the others once it is up with
no lifespan of their own. Signals are taken here, not by each server (uvicorn's servers each install
handlers, and the last one installed would be the only one told): SIGINT or SIGTERM stops them all
gracefully, a second SIGINT forces it; should one server stop on its own, the others are stopped too,
so the process exits and its supervisor (serving/supervisor.py) starts it again.
"""
from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from typing import Iterator

import uvicorn

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(uvicorn.Server):
    """A server that leaves signals to :func:`run_servers`."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def run_servers(configs: list[uvicorn.Config]) -> None:
    """Serve each config until a signal (or one server ending) stops them all; blocks until then."""
    servers = [_Server(config) for config in configs]
    with asyncio.Runner(loop_factory=configs[0].get_loop_factory()) as runner, _signals_to(servers):
        runner.run(serve_together(servers))


async def serve_together(servers: list[uvicorn.Server]) -> None:
    first, others = servers[0], servers[1:]
    tasks = [asyncio.create_task(first.serve())]
    while not first.started and not tasks[0].done():
        await asyncio.sleep(0.05)
    if first.started:
        tasks += [asyncio.create_task(server.serve()) for server in others]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks)


@contextlib.contextmanager
def _signals_to(servers: list[uvicorn.Server]) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(sig: int, _frame) -> None:
        for server in servers:
            if server.should_exit and sig == signal.SIGINT:
                server.force_exit = True
            server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

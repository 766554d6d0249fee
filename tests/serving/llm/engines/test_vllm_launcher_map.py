"""How a worker reads the LLM launcher's ``/engines`` map, against a launcher stand-in on a real socket
(aiohttp): a burst of requests shares one read (8 streams at once each read it, and a launcher busy with
its engines answered none in time: all 503, seen in test_replicas_e2e), and a launcher that stops
answering leaves the last map in use for ``MAP_STALE_S``, then the requests get the 503."""
from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from serving.llm.engines import vllm
from serving.llm.engines.vllm import VllmEngine
from serving.worker.errors import Unavailable

MAP = {"tiny:1": {"url": "http://127.0.0.1:1/v1", "served_model_name": "tiny:1", "state": "ready", "error": None}}


class Launcher:
    def __init__(self) -> None:
        self.reads, self.delay_s = 0, 0.2

    async def engines(self, request: web.Request) -> web.Response:
        self.reads += 1
        await asyncio.sleep(self.delay_s)
        return web.json_response({"engines": MAP})

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/engines", self.engines)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


async def _with(launcher: Launcher, body) -> None:
    url = await launcher.start()
    engine = VllmEngine(url, timeout_s=30.0, counter=None)  # no prompt is counted here
    try:
        await body(engine)
    finally:
        await engine.close()
        await launcher.runner.cleanup()


def test_a_burst_of_requests_shares_one_read_of_the_map():
    launcher = Launcher()

    async def body(engine: VllmEngine) -> None:
        maps = await asyncio.gather(*(engine._engines(fresh=True) for _ in range(8)))
        assert all(m == MAP for m in maps)
        assert launcher.reads == 1

    asyncio.run(_with(launcher, body))


def test_a_silent_launcher_leaves_the_last_map_in_use_then_a_503(monkeypatch):
    monkeypatch.setattr(vllm, "MAP_READ_TIMEOUT_S", 0.3)
    launcher = Launcher()

    async def body(engine: VllmEngine) -> None:
        assert await engine._engines(fresh=True) == MAP
        launcher.delay_s = 5.0  # busy: no answer within the read's timeout
        assert await engine._engines(fresh=True) == MAP  # the map read a moment ago
        monkeypatch.setattr(vllm, "MAP_STALE_S", 0.0)
        with pytest.raises(Unavailable, match="does not answer"):
            await engine._engines(fresh=True)

    asyncio.run(_with(launcher, body))

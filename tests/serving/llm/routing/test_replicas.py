"""An engine's replicas as the worker sees them (serving/llm/routing/replicas.py, external.py) and the
failover in serving/llm/engines/vllm.py, over real HTTP on loopback sockets.

The engines here are small aiohttp servers that answer completions in the shape vLLM's OpenAI server
does, plus its ``/health`` and the two queue gauges of its ``/metrics``: they stand in for vLLM only in
being up, down or busy on cue (tests/serving/llm/test_replicas_e2e.py runs real vLLM replicas). Host
names resolve through a lookup function given to the replica set (the seam is the resolver, not DNS).
"""
from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from serving.llm.engines.vllm import VllmEngine
from serving.worker.errors import Unavailable
from serving.llm.routing import replicas as replicas_module
from serving.llm.routing.external import ExternalReplicas
from serving.llm.routing.replicas import engine_queue
from serving.llm.routing.policies.base import RouteHint
from serving.worker.runtime import Target

SERVED = "llama:1"


@dataclass
class Engine:
    host: str = "127.0.0.1"
    port: int = 0
    queue: float = 0.0          # what its /metrics says runs and waits
    hold: asyncio.Event | None = None  # completions wait for it
    answered: list[str] = field(default_factory=list)
    runner: web.AppRunner | None = None

    async def start(self) -> "Engine":
        app = web.Application()
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=(
            "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{SERVED}"}} {self.queue}\n'
            f'vllm:num_requests_waiting{{engine="0",model_name="{SERVED}"}} 0.0\n'))

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.hold is not None:
            await self.hold.wait()
        self.answered.append(body["prompt"])
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                                  "choices": [{"index": 0, "text": f"{body['prompt']}@{self.port}",
                                               "finish_reason": "stop"}]})

    async def stop(self) -> None:
        await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def target(url: str, routing: str | None = None) -> Target:
    options = {"url": url, "served_model_name": SERVED} | ({"routing": routing} if routing else {})
    return Target(model="llama", version=1, weight=100.0, triton_name="", artifact="", inputs=(), outputs=(),
                  engine_options=options)


async def complete(worker: VllmEngine, t: Target, prompt: str, hint: RouteHint | None = None) -> str:
    return (await worker.post(t, "completions", {"model": "chat", "prompt": prompt}, hint))["choices"][0]["text"]


def run(scenario) -> None:
    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_queue_gauges_are_read_from_vllms_metrics_text():
    text = (b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
            b'vllm:num_requests_waiting{engine="0",model_name="m"} 2.0\n'
            b'vllm:num_requests_running{engine="1",model_name="m"} 1.0\n'
            b'vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0\n'
            b'vllm:num_requests_swapped 7.0\n')
    assert engine_queue(text) == 6.0


def test_requests_spread_over_several_urls_and_a_dead_one_fails_over(monkeypatch):
    """Two engines and a third URL where nothing listens: every request is answered by the two live ones,
    the dead URL is tried once (then taken out), and round-robin alternates between the live ones."""
    monkeypatch.setattr(replicas_module, "PROBE_PERIOD_S", 0.05)

    async def scenario():
        a, b, dead = await Engine().start(), await Engine().start(), await Engine().start()
        await dead.stop()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        t = target(",".join(e.url for e in (a, b, dead)), routing="round-robin")
        try:
            answers = [await complete(worker, t, f"p{i}") for i in range(12)]
            assert all(text.startswith(f"p{i}@") for i, text in enumerate(answers))
            assert len(a.answered) + len(b.answered) == 12 and abs(len(a.answered) - len(b.answered)) <= 1
            replicas = worker._sets[t.engine_options["url"]]
            assert replicas.failovers == 1, "the dead URL was tried once, then taken out"
            assert [r.down for r in replicas.members.values()] == [False, False, True]
        finally:
            await worker.close()
            await a.stop()
            await b.stop()
    run(scenario)


def test_a_replica_taken_out_comes_back_once_its_health_answers(monkeypatch):
    monkeypatch.setattr(replicas_module, "PROBE_PERIOD_S", 0.05)

    async def scenario():
        a, b = await Engine().start(), await Engine().start()
        port_b = b.port
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        t = target(f"{a.url},{b.url}", routing="round-robin")
        try:
            await b.stop()
            for i in range(4):
                await complete(worker, t, f"p{i}")
            assert len(a.answered) == 4
            b = await Engine(port=port_b).start()  # back, on the same address
            for _ in range(100):
                if not any(r.down for r in worker._sets[t.engine_options["url"]].members.values()):
                    break
                await asyncio.sleep(0.05)
            for i in range(4):
                await complete(worker, t, f"q{i}")
            assert len(b.answered) == 2, "round-robin again over both"
        finally:
            await worker.close()
            await a.stop()
            await b.stop()
    run(scenario)


def test_every_replica_down_is_a_503_naming_the_failure():
    async def scenario():
        a, b = await Engine().start(), await Engine().start()
        await a.stop()
        await b.stop()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        try:
            with pytest.raises(Unavailable, match="is not answering .ClientConnectorError"):
                await complete(worker, target(f"{a.url},{b.url}"), "p")
        finally:
            await worker.close()
    run(scenario)


def test_a_name_resolving_to_several_addresses_is_one_replica_each_as_pods_come_and_go(monkeypatch):
    """``http://llm.test:PORT/v1`` resolves (here: by the lookup given) to 127.0.0.1 and 127.0.0.2, each
    with an engine on PORT: both get requests; once the name resolves to one address only, the other
    gets no more; a failed lookup keeps what was known."""
    async def scenario():
        a = await Engine(host="127.0.0.1").start()
        b = await Engine(host="127.0.0.2", port=a.port).start()
        found = {"llm.test": ["127.0.0.1", "127.0.0.2"]}
        source = ExternalReplicas(f"http://llm.test:{a.port}/v1", resolve=lambda host, port: list(found[host]),
                                  period_s=0.0)
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        t = target(source.setting)
        worker._external[source.setting] = source
        try:
            for i in range(6):
                await complete(worker, t, f"p{i}")
            assert (len(a.answered), len(b.answered)) == (3, 3), "idle least-loaded: ties rotate"
            assert sorted(worker._sets[source.setting].members) == ["llm.test@127.0.0.1", "llm.test@127.0.0.2"]
            found["llm.test"] = ["127.0.0.2"]  # pod 127.0.0.1 went away
            for i in range(4):
                await complete(worker, t, f"q{i}")
            assert (len(a.answered), len(b.answered)) == (3, 7)
            found["llm.test"] = []  # the name service is down: keep what was known
            await complete(worker, t, "r")
            assert len(b.answered) == 8
        finally:
            await worker.close()
            await a.stop()
            await b.stop()
    run(scenario)


def test_least_loaded_counts_this_workers_requests_and_the_engines_own_queue(monkeypatch):
    """Engine a holds its answers: this worker's requests pile up there, so new ones go to b. Then a's
    /metrics says 5 others' requests run there while b's says 0: requests go to b even with a idle here."""
    monkeypatch.setattr(replicas_module, "METRICS_PERIOD_S", 0.05)

    async def scenario():
        a, b = await Engine(hold=asyncio.Event()).start(), await Engine().start()
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        t = target(f"{a.url},{b.url}")
        try:
            held = asyncio.ensure_future(complete(worker, t, "h"))
            await asyncio.sleep(0.2)
            for i in range(5):
                await complete(worker, t, f"p{i}")
            assert len(b.answered) == 5 and a.answered == [], "a has one of ours running"
            a.hold.set()
            await held
            a.queue = 5.0
            replicas = worker._sets[t.engine_options["url"]]
            for _ in range(200):  # until a metrics read saw it
                if Counter(r.engine_queue for r in replicas.members.values()) == Counter({5.0: 1, 0.0: 1}):
                    break
                await asyncio.sleep(0.025)
            assert Counter(r.engine_queue for r in replicas.members.values()) == Counter({5.0: 1, 0.0: 1})
            for i in range(4):
                await complete(worker, t, f"q{i}")
            assert len(b.answered) == 9 and len(a.answered) == 1
        finally:
            await worker.close()
            await a.stop()
            await b.stop()
    run(scenario)


def test_session_routing_keeps_a_session_on_one_engine(monkeypatch):
    async def scenario():
        engines = [await Engine().start() for _ in range(3)]
        worker = VllmEngine("http://127.0.0.1:1", timeout_s=10, counter=None)
        t = target(",".join(e.url for e in engines), routing="session")
        try:
            homes: dict[str, set[str]] = {}
            for turn in range(3):
                for user in range(48):  # the engines' ports are random: all 48 miss one of 3 with p = 3(2/3)^48 < 1e-8
                    text = await complete(worker, t, f"u{user}", RouteHint(session=f"user-{user}"))
                    homes.setdefault(f"user-{user}", set()).add(text.split("@")[1])
            assert all(len(ports) == 1 for ports in homes.values()), homes
            assert len({p for ports in homes.values() for p in ports}) == 3, "48 sessions use the three engines"
        finally:
            await worker.close()
            for e in engines:
                await e.stop()
    run(scenario)

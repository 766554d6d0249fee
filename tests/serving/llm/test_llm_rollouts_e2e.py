"""Shadow copies and gated rollouts on an LLM endpoint, end to end: a real control plane, statistics
service, launcher, worker and two real vLLM engines (the module's only two: tiny Llamas of seeds 0
and 1, uploaded as tiny:1 and tiny:2 and run by the launcher).

One stand-in, said here: the worker finds the engines through a small proxy of the launcher's
``/engines`` map written in this test (:class:`EngineMapProxy`). It relays everything, and routes
tiny:2's engine through itself so the test can hold a shadow copy until it releases it (to assert
ordering without timings) or delay that engine's answers (a candidate made slower, deterministically:
the delay is added before any byte, so its time to first token is at least the delay).

Endpoint ``chat`` runs tiny:1 with tiny:2 as a shadow (two different models: agreement below 1).
Endpoint ``same`` is an external-engine endpoint pointed at tiny:1's engine, so its shadow version 2
is answered by the same weights as its live version 1 (two copies of the same model: agreement 1).
"""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading

import httpx
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from serving.llm.naming import engine_key
from serving.settings import LLMSettings
from serving.testmodels_llm import build_tiny_llama
from tests.serving.stack import make_stack
from tests.support.ci import cannot_run
from tests.support.procs import REPO, wait_until

START_S = 420.0  # an engine starts in about 45 s alone; other suites share the machine's two cores
DELAY_S = 3.0    # the slowed candidate's added time to first token
GATE_MS = 1500   # its gate: the live engine's own TTFT on this machine is far below, the delayed one above
pytestmark = pytest.mark.timeout(START_S + 180)  # the first test's share includes the engines' start

PROMPTS = ["the quick brown fox", "canary releases", "shadow traffic", "a b c d"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SHADOW_KEY = engine_key("tiny", 2, {"max_model_len": 512})
LIVE_KEY = engine_key("tiny", 1, {"max_model_len": 512})


class EngineMapProxy:
    """The launcher's /engines as the worker sees it, both engines reached through here: tiny:2's (the
    shadow's, whose requests can be held or slowed) and tiny:1's (chat's live version, whose streams'
    ends are noted in ``log``: a moment of the worker's own order, not of the test client's reading)."""

    def __init__(self, launcher: str, keys: tuple[str, ...] = (SHADOW_KEY, LIVE_KEY)) -> None:
        self.launcher, self.keys, self.port = launcher, keys, free_port()
        self.delay_s = 0.0
        self._upstreams: dict[int, str] = {}
        self.hold = threading.Event()
        self.hold.set()                      # cleared: requests to the engine wait until it is set again
        self.arrivals: list[tuple[str, dict]] = []  # (path, body) of each request to the engine, in order
        self.log: list[str] = []             # shared ordering log with the test's client
        app = Starlette(routes=[Route("/engines", self.engines), Route("/health", self.health),
                                Route("/engine/{slot:int}/{path:path}", self.forward, methods=["GET", "POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "EngineMapProxy":
        self.thread.start()
        wait_until(lambda: httpx.get(f"{self.url}/health", timeout=2).status_code == 200, 20, "the map proxy")
        return self

    def stop(self) -> None:
        self.hold.set()
        self.server.should_exit = True
        self.thread.join(timeout=10)

    async def _real(self) -> dict:
        async with httpx.AsyncClient() as c:
            return (await c.get(f"{self.launcher}/engines", timeout=30)).json()

    async def _replica(self, slot: int, fresh: bool = False) -> str:
        """An engine's replica URL, asked of the launcher once and again only when it stops answering there:
        asked per request, the launcher's map under a full suite's load (seconds an answer) failed copies
        before they reached the proxy's record, and the shadow test waited for comparisons never made."""
        if slot not in self._upstreams or fresh:
            self._upstreams[slot] = (await self._real())["engines"][self.keys[slot]]["replicas"][0]["url"]
        return self._upstreams[slot]

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def engines(self, request: Request) -> Response:
        real = await self._real()
        for slot, key in enumerate(self.keys):
            entry = real["engines"].get(key)
            if entry:  # the worker reaches an engine through its replicas' URLs (one replica here)
                here = f"{self.url}/engine/{slot}/v1"
                entry["url"] = here
                entry["replicas"] = [{**r, "url": here} for r in entry.get("replicas") or ()]
                assert len(entry["replicas"]) == 1, "the proxy stands in for one replica"
        return JSONResponse(real)

    async def forward(self, request: Request) -> Response:
        slot, path = request.path_params["slot"], request.path_params["path"].removeprefix("v1/")
        body = await request.body()
        shadow = self.keys[slot] == SHADOW_KEY
        if request.method == "POST" and shadow:
            self.arrivals.append((path, httpx.Response(200, content=body).json()))
            self.log.append("shadow arrived")
            while not self.hold.is_set():
                await asyncio.sleep(0.05)
            await asyncio.sleep(self.delay_s)
        client = httpx.AsyncClient(timeout=120)
        for fresh in (False, True):  # the replica moved (restarted elsewhere): ask the launcher again
            upstream = await self._replica(slot, fresh)
            root = upstream[:-3] if request.path_params["path"] in ("health", "metrics") else upstream
            try:
                r = await client.send(client.build_request(request.method, f"{root}/{path}", content=body,
                                                           headers={"content-type": "application/json"}), stream=True)
                break
            except httpx.ConnectError:
                if fresh:
                    await client.aclose()
                    raise

        async def relay():
            tail = b""  # the last bytes relayed: a read may end inside "data: [DONE]"
            try:
                async for chunk in r.aiter_raw():
                    if not shadow and b"data: [DONE]" in tail + chunk:  # noted before the worker can read it
                        self.log.append("live stream ended")
                    tail = (tail + chunk)[-16:]
                    yield chunk
            finally:
                await r.aclose()
                await client.aclose()

        return StreamingResponse(relay(), status_code=r.status_code, media_type=r.headers.get("content-type"))


def cli(stack, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=stack.env, cwd=REPO,
                         capture_output=True, text=True, timeout=START_S + 60)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    if LLMSettings().vllm_python is None and not os.environ.get("SERVING_VLLM_PYTHON"):
        cannot_run("no vLLM venv (.venv-vllm): run scripts/setup.sh")
    root = tmp_path_factory.mktemp("llm-rollouts")
    first, second = build_tiny_llama(root / "seed0", seed=0), build_tiny_llama(root / "seed1", seed=1)
    stack = make_stack(root / "home", workers=1)
    stack.env["SERVING_ROLLOUT_TICK_S"] = "0.2"
    proxy = EngineMapProxy(stack.llm_launcher_url)
    try:
        stack.start_control_plane()
        stack.start_statistics()
        stack.start_llm()
        proxy.start()
        port = stack.worker_ports[0]
        stack.start("worker0", ["worker"], f"http://127.0.0.1:{port}/v2/health/live",
                    {"SERVING_WORKER_PORT": str(port), "SERVING_WORKER_CACHE": str(stack.home / "worker0.json"),
                     "SERVING_LLM_LAUNCHER_URL": proxy.url})
        cli(stack, "model", "upload", "--name", "tiny", "--path", str(first.path))
        cli(stack, "model", "upload", "--name", "tiny", "--path", str(second.path))
        # both engines start at once (the shadow's too), then the fixture waits for them
        cli(stack, "model", "add", "--engine", "vllm", "--endpoint", "chat", "--model", "tiny:1",
            "--aux-config", "max_model_len=512")
        cli(stack, "model", "add", "--endpoint", "chat", "--model", "tiny:2", "--shadow", "100%")
        entry = wait_until(lambda: httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"]
                           .get(engine_key("tiny", 1, {"max_model_len": 512})), 30, "tiny:1 in the launcher's map")
        cli(stack, "model", "add", "--engine", "vllm", "--endpoint", "same", "--model", "tiny:1",
            "--aux-config", f"url={entry['url']}", f"served_model_name={entry['served_model_name']}",
            "max_model_len=512")
        cli(stack, "model", "add", "--endpoint", "same", "--model", "tiny:2", "--shadow", "100%")
        engines = lambda: httpx.get(f"{stack.llm_launcher_url}/engines", timeout=5).json()["engines"]  # noqa: E731
        wait_until(lambda: {e["state"] for e in engines().values()} == {"ready"} and len(engines()) == 2, START_S,
                   "both engines ready")
        base = f"{stack.worker_url()}/serve/openai/v1"
        for endpoint in ("chat", "same"):
            wait_until(lambda: httpx.post(f"{base}/completions", timeout=60, json={  # pinned: never copied
                "model": f"{endpoint}/1", "prompt": "a", "max_tokens": 1}).status_code == 200, 60, f"{endpoint} answering")
        yield {"stack": stack, "proxy": proxy, "base": base}
    finally:
        stack.stop_all()
        proxy.stop()


def metric(stack, name: str, endpoint: str, version: int) -> float:
    text = httpx.get(f"{stack.statistics_url()}/metrics", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and s.labels.get("endpoint") == endpoint and s.labels.get("version") == str(version))


def ask(base: str, endpoint: str, prompt: str, stream: bool) -> str:
    body = {"model": endpoint, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": stream}
    with httpx.Client(timeout=120) as c:
        if not stream:
            return c.post(f"{base}/completions", json=body).json()["choices"][0]["text"]
        text = []
        with c.stream("POST", f"{base}/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    text.extend(ch.get("text") or "" for ch in httpx.Response(200, content=line[6:]).json()["choices"])
        return "".join(text)


def shadow_figures(stack, proxy) -> str:
    """What a timeout needs to say: the statistics' shadow series (copies by status, dropped, agreement)
    and how many copies reached the shadow's engine through the proxy."""
    text = httpx.get(f"{stack.statistics_url()}/metrics", timeout=5).text
    lines = [line for line in text.splitlines() if "shadow" in line and not line.startswith("#")]
    return "\n".join([*lines, f"copies at the shadow's engine (proxy): {len(proxy.arrivals)}"])


def test_shadow_agreement_is_1_for_the_same_model_and_below_for_another(llm):
    stack, base = llm["stack"], llm["base"]
    count = "serving_llm_shadow_agreement_count"
    before = {ep: metric(stack, count, ep, 2) for ep in ("chat", "same")}
    sums = {ep: metric(stack, "serving_llm_shadow_agreement_sum", ep, 2) for ep in ("chat", "same")}
    for i, prompt in enumerate(PROMPTS):
        for endpoint in ("chat", "same"):
            ask(base, endpoint, prompt, stream=bool(i % 2))  # plain answers and streams alike
    for endpoint in ("chat", "same"):
        wait_until(lambda: metric(stack, count, endpoint, 2) - before[endpoint] == len(PROMPTS), 120,
                   f"{endpoint}'s shadow copies compared",
                   on_timeout=lambda: shadow_figures(stack, llm["proxy"]))
    same = metric(stack, "serving_llm_shadow_agreement_sum", "same", 2) - sums["same"]
    other = metric(stack, "serving_llm_shadow_agreement_sum", "chat", 2) - sums["chat"]
    assert same == len(PROMPTS)  # greedy: every copy's text equal to the live one's
    assert other < len(PROMPTS)  # another model's weights: some greedy text differs
    assert metric(stack, "serving_requests_total", "chat", 2) == 0  # copies never count as served requests


def test_the_live_stream_ends_before_its_shadow_copy_is_sent(llm):
    """The copy is held at the proxy until released: the client has the whole stream, [DONE] included,
    while the copy has not been answered; and the copy arrived only after the stream's end."""
    stack, base, proxy = llm["stack"], llm["base"], llm["proxy"]
    before = metric(stack, "serving_llm_shadow_agreement_count", "chat", 2)
    proxy.hold.clear()
    proxy.log.clear()
    proxy.arrivals.clear()
    try:
        body = {"model": "chat", "prompt": "ordering", "max_tokens": 8, "temperature": 0, "stream": True}
        with httpx.Client(timeout=120) as c, c.stream("POST", f"{base}/completions", json=body) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and r.headers["X-Model-Version"] == "1"
        wait_until(lambda: proxy.arrivals, 30, "the shadow copy at the engine")
        # sent after the engine's live stream ended: the proxy noted that end before the worker could see it
        assert proxy.log[:2] == ["live stream ended", "shadow arrived"], proxy.log
        assert proxy.arrivals[0][1]["stream"] is False and "stream_options" not in proxy.arrivals[0][1]
        assert metric(stack, "serving_llm_shadow_agreement_count", "chat", 2) == before  # still held
    finally:
        proxy.hold.set()
    wait_until(lambda: metric(stack, "serving_llm_shadow_agreement_count", "chat", 2) == before + 1, 60,
               "the released copy compared")


def test_canary_10_percent_share_and_sticky_routing_key(llm):
    """``model add --canary 10%`` (tiny:2, chat's shadow until now, becomes its canary): version 2 answers
    Binomial(N, 0.1) of N requests, accepted within 5 standard deviations of N x 0.1 (a false failure
    about once in 3.5 million runs); with an X-Routing-Key every request of a key lands on one version,
    and keys spread over both."""
    stack, base = llm["stack"], llm["base"]
    cli(stack, "model", "add", "--engine", "vllm", "--endpoint", "chat", "--model", "tiny:2", "--canary", "10%")
    wait_until(lambda: [v["weight"] for v in httpx.get(f"{stack.worker_url()}/status", timeout=5).json()
                        ["endpoints"]["chat"]["versions"]] == [90.0, 10.0], 60, "the canary on the worker")
    n, share = 200, 0.1
    body = {"model": "chat", "prompt": "a", "max_tokens": 1}
    with httpx.Client(base_url=base, timeout=60) as c:
        versions = [c.post("/completions", json=body).headers["X-Model-Version"] for _ in range(n)]
        by_key = {key: {c.post("/completions", json=body, headers={"X-Routing-Key": key}).headers["X-Model-Version"]
                        for _ in range(3)} for key in [f"user-{i}" for i in range(40)]}
    mean, sd = n * share, (n * share * (1 - share)) ** 0.5
    assert abs(versions.count("2") - mean) <= 5 * sd, versions.count("2")
    assert all(len(v) == 1 for v in by_key.values()), by_key  # sticky
    assert {v for vs in by_key.values() for v in vs} == {"1", "2"}  # hashes of fixed keys: some fall in the 10%


def test_a_rollout_of_a_slower_candidate_is_rolled_back_on_ttft(llm):
    stack, base, proxy = llm["stack"], llm["base"], llm["proxy"]
    # tiny:2 is chat's canary: starting the rollout makes it the candidate (its engine keeps running)
    proxy.delay_s = DELAY_S
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            try:
                ask(base, "chat", "rollout", stream=True)
            except httpx.HTTPError:
                pass

    threads = [threading.Thread(target=load) for _ in range(3)]
    try:
        for t in threads:
            t.start()
        cli(stack, "rollout", "start", "--endpoint", "chat", "--model", "tiny:2", "--steps", "50,100",
            "--interval", "8s", "--max-ttft-p99-ms", str(GATE_MS), "--min-requests", "2")
        r = wait_until(lambda: (lambda x: x if x["state"] != "running" else None)(
            json.loads(cli(stack, "rollout", "status", "--endpoint", "chat", "--json"))[0]),
            120, "the rollout judged")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=150)
        proxy.delay_s = 0.0
    assert r["state"] == "rolled_back", r
    assert "time to first token p99" in r["reason"] and f"> {GATE_MS} ms" in r["reason"], r["reason"]
    assert r["reason"].startswith("rolled back at step 1 (50%)")
    eps = json.loads(cli(stack, "endpoint", "list", "--json"))
    assert {t["version"]: t["weight"] for ep in eps if ep["name"] == "chat" for t in ep["targets"]} == {1: 100.0}

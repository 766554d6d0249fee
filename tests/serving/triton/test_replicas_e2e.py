"""Several Triton servers behind one worker engine (issue 34): real `serving triton` processes.

Two embedded Tritons (`serving triton`, each a real tritonserver) follow one control plane, as two
Triton pods of the Helm chart do: one on 127.0.0.1, one on 127.0.0.2, on the same ports, as two
pods behind a headless Service. The worker's Triton engine (serving/worker/engines/triton.py) is
given ``dns:///triton.test:PORT``; the one fake here is the resolver (``lookup``), which answers
those two loopback addresses as the cluster's DNS would answer the headless Service's pod IPs:
no name service can be set up in a test. Everything else is real: tritonserver, gRPC over
sockets, stock ``tritonclient``. The control plane is tests/serving/triton/fake_control_plane.py
(the config stream and the artifacts). Answers are compared with onnxruntime run on the same
input; per-server counts come from each Triton's own ``/metrics``. The autoscaling signals the control plane
serves for Triton's HPA (registry/autoscaling/catalogue.py) are read from both, through the same stand-in
for the headless Service, and checked against each server's own counters.
"""
from __future__ import annotations

import asyncio
import hashlib
import re
import signal

import httpx
import numpy as np
import psutil
import pytest

from registry.autoscaling.catalogue import signals
from serving import dns
from serving.worker.engines.triton import TritonEngine
from serving.worker.engines.triton_pool import TritonPool, addresses_source
from serving.worker.errors import ServingError
from serving.worker.runtime import Target
from tests.serving.triton.fake_control_plane import FakeControlPlane, running, target, triton_endpoint
from tests.serving.triton.test_embedded import batch_inputs, direct_logits
from tests.support.procs import free_port, port_open, serving_process, wait_until

HOSTS = ("127.0.0.1", "127.0.0.2")
MODELS = ("clf_v1", "clf_v2")


def served(host: str, port: int, model: str) -> int:
    """Successful inferences of ``model`` that this Triton counted (its own Prometheus metrics)."""
    text = httpx.get(f"http://{host}:{port}/metrics", timeout=5).text
    m = re.search(rf'^nv_inference_request_success{{[^}}]*model="{model}"[^}}]*}} (\S+)$', text, re.M)
    return int(float(m.group(1))) if m else 0


def counters(port: int) -> tuple[float, float]:
    """(queue time in µs, successes) summed over both servers and every model: what the signal reads."""
    total = [0.0, 0.0]
    for host in HOSTS:
        text = httpx.get(f"http://{host}:{port}/metrics", timeout=5).text
        for i, name in enumerate(("nv_inference_queue_duration_us", "nv_inference_request_success")):
            total[i] += sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))
    return total[0], total[1]


def model_ready(host: str, port: int, model: str) -> bool:
    try:
        return httpx.get(f"http://{host}:{port}/v2/models/{model}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def readiness(host: str, port: int) -> tuple[int, dict]:
    r = httpx.get(f"http://{host}:{port}/ready", timeout=5)
    return r.status_code, r.json()


def tritonserver_of(proc) -> psutil.Process:
    (server,) = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "tritonserver"]
    return server


class Load:
    """A steady load: ``workers`` callers, each sending requests one after another and checking
    every answer against onnxruntime's; counts answers, wrong answers and failures."""

    def __init__(self, engine: TritonEngine, target: Target, cases: list[tuple[dict, np.ndarray]]) -> None:
        self.engine, self.target, self.cases = engine, target, cases
        self.ok = self.wrong = 0
        self.failures: list[str] = []
        self.stop = asyncio.Event()

    async def one(self, i: int) -> None:
        feeds, want = self.cases[i % len(self.cases)]
        try:
            got = await self.engine.infer(self.target, feeds)
        except ServingError as exc:
            self.failures.append(f"{type(exc).__name__}: {exc}")
            return
        if np.allclose(got["logits"], want, atol=1e-4):
            self.ok += 1
        else:
            self.wrong += 1

    async def run(self, workers: int, total: int, before=lambda i: None) -> None:
        """``total`` requests, ``workers`` at a time; ``before(i)`` runs as request ``i`` starts."""
        tickets = iter(range(total))

        async def caller() -> None:
            for i in tickets:
                before(i)
                await self.one(i)

        await asyncio.gather(*(caller() for _ in range(workers)))


@pytest.mark.timeout(300)
def test_two_tritons_hold_every_model_before_ready_share_the_load_and_survive_one_killed(
        tmp_path, tiny_model, tiny_model_b, monkeypatch):
    fake = FakeControlPlane()
    sha_a = fake.add_artifact(tiny_model.onnx_path)
    sha_b = hashlib.sha256(tiny_model_b.onnx_path.read_bytes()).hexdigest()  # withheld for now
    fake.publish({"clf": triton_endpoint("clf", [target("clf", 1, sha_a, tiny_model.signature, 50.0),
                                                 target("clf", 2, sha_b, tiny_model_b.signature, 50.0)],
                                         max_batch_size=8)})
    http, grpc, metrics, ready_port = free_port(), free_port(), free_port(), free_port()
    if not all(port_open(p, HOSTS[1]) is False for p in (http, grpc, metrics, ready_port)):
        pytest.fail("a port free on 127.0.0.1 is taken on 127.0.0.2")
    with running(fake) as cp_url:
        def env(i: int) -> dict[str, str]:
            return {"SERVING_HOME": str(tmp_path / f"home{i}"), "SERVING_CONTROL_PLANE_URL": cp_url,
                    "SERVING_TRITON_HOST": HOSTS[i], "SERVING_TRITON_HTTP_PORT": str(http),
                    "SERVING_TRITON_GRPC_PORT": str(grpc), "SERVING_TRITON_METRICS_PORT": str(metrics),
                    "SERVING_TRITON_READINESS_PORT": str(ready_port), "SERVING_TRITON_ORT_THREADS": "1"}

        with serving_process(["triton"], env(0), tmp_path / "triton0.log") as p0, \
                serving_process(["triton"], env(1), tmp_path / "triton1.log") as p1:
            procs = (p0, p1)
            # 1. Not ready while a deployed model is not loaded (its artifact cannot be had yet) ...
            for host in HOSTS:
                wait_until(lambda: model_ready(host, http, "clf_v1"), 120, f"clf_v1 loaded on {host}")
                status, body = readiness(host, ready_port)
                assert (status, body["ready"], body["waiting"]) == (503, False, ["clf_v2"]), body
                # what a probe on Triton's own readiness would have let through: ready, clf_v2 missing
                assert httpx.get(f"http://{host}:{http}/v2/health/ready", timeout=5).status_code == 200
            # ... and ready only once every deployed model is: each 200 seen is checked at once.
            fake.add_artifact(tiny_model_b.onnx_path)
            seen_ready = set()

            def both_ready() -> bool:
                for host in HOSTS:
                    if host not in seen_ready and readiness(host, ready_port)[0] == 200:
                        assert all(model_ready(host, http, m) for m in MODELS), f"{host} ready before its models"
                        seen_ready.add(host)
                return len(seen_ready) == 2

            wait_until(both_ready, 120, "both Tritons ready", interval=0.05)

            # 2. The engine, given the "headless Service" name, spreads its calls over both.
            lookup = lambda _host, port: [f"{h}:{port}" for h in HOSTS]  # noqa: E731 - the DNS stand-in
            pool = TritonPool(addresses_source(f"dns:///triton.test:{grpc}", lookup), resolve_period_s=1.0)
            assert pool.addresses() == [f"{h}:{grpc}" for h in HOSTS]
            engine = TritonEngine(pool, timeout_s=30.0, batching=False)
            tgt = Target.from_snapshot(target("clf", 1, sha_a, tiny_model.signature),
                                       {"max_batch_size": 8})
            cases = []
            for seed in range(6):
                feeds = batch_inputs(1 + seed % 3, 6 + seed, seed)
                cases.append((feeds, direct_logits(tiny_model.onnx_path, feeds)))
            assert engine.is_ready(tgt)

            async def counted(load: Load, workers: int, total: int) -> list[int]:
                before = [served(h, metrics, "clf_v1") for h in HOSTS]
                await load.run(workers, total)
                return [served(h, metrics, "clf_v1") - b for h, b in zip(HOSTS, before)]

            # the autoscaling signals, read from both servers as the control plane reads a headless Service's pods
            monkeypatch.setattr(dns, "addresses", lambda host, port, what: [(2, h) for h in HOSTS])
            served_signals = signals(triton=f"triton.test:{metrics}")
            (scrape,), (pending, queue_ms) = served_signals.scrapes, served_signals.signals
            scrape.window_s = 600

            async def scenario() -> dict:
                # one call at a time: both always have none in flight, so they take turns exactly
                turns = Load(engine, tgt, cases)
                out = {"turns": turns, "per_server_turns": await counted(turns, 1, 40)}
                # four at a time: the fewest in flight first (a slower server gets fewer; both get some)
                async with httpx.AsyncClient(timeout=5) as client:
                    await scrape.sample(client)
                    out["counters_before"] = await asyncio.to_thread(counters, metrics)
                    spread = Load(engine, tgt, cases)
                    out["spread"], out["per_server"] = spread, await counted(spread, 4, 80)
                    out["counters_after"] = await asyncio.to_thread(counters, metrics)
                    await scrape.sample(client)
                out["pending"], out["queue_ms"], out["pods"] = pending.value(), queue_ms.value(), scrape.pods

                # 3. One Triton killed (SIGKILL) under a steady load: no request lost.
                steady = Load(engine, tgt, cases)
                killed = tritonserver_of(procs[1])
                await steady.run(4, 200, lambda i: i == 40 and killed.send_signal(signal.SIGKILL))
                out["steady"], out["failovers"] = steady, pool.failovers

                # 4. The killed one comes back (`serving triton` starts a new tritonserver and loads
                # the models again): the engine uses it again.
                await asyncio.to_thread(wait_until, lambda: all(model_ready(HOSTS[1], http, m) for m in MODELS),
                                        120, "the killed Triton back with its models")
                await asyncio.to_thread(wait_until, lambda: len(pool.up()) == 2, 30, "the engine took it back")
                back = Load(engine, tgt, cases)
                out["back"], out["back_per_server"] = back, await counted(back, 1, 20)
                out["ready_after"] = await engine.ready(tgt)
                await engine.close()
                return out

            out = asyncio.run(scenario())
            turns, spread, steady, back = out["turns"], out["spread"], out["steady"], out["back"]
            assert (turns.ok, turns.wrong, turns.failures) == (40, 0, [])
            assert out["per_server_turns"] == [20, 20]
            assert (spread.ok, spread.wrong, spread.failures) == (80, 0, [])
            assert sum(out["per_server"]) == 80 and min(out["per_server"]) > 0, out["per_server"]
            assert (steady.ok, steady.wrong, steady.failures) == (200, 0, []), steady.failures[:5]
            assert out["failovers"] >= 1  # calls did reach the killed one, and were made again on the other
            assert (back.ok, back.wrong, back.failures) == (20, 0, [])
            assert out["back_per_server"] == [10, 10]  # the restarted one takes its turns again
            assert out["ready_after"] is True
            (q0, n0), (q1, n1) = out["counters_before"], out["counters_after"]
            assert out["pods"] == 2 and n1 - n0 == 80
            assert out["queue_ms"].value == pytest.approx((q1 - q0) / (n1 - n0) / 1000)  # both servers' own counters
            assert out["pending"].value == 0.0  # sampled with nothing in flight
            assert all(p.poll() is None for p in procs)
            print(f"per server: one at a time {out['per_server_turns']}, four at a time {out['per_server']}; "
                  f"killed under load: {steady.ok} answered, 0 lost, {out['failovers']} failed over; "
                  f"back, one at a time: {out['back_per_server']}; Triton's queue for the HPA: "
                  f"{out['queue_ms'].value:.3f} ms a request over {n1 - n0:.0f}")

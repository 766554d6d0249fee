"""A step load on a release and what the cluster does about it, for the autoscaling tests
(test_worker_autoscaling.py, test_llm_engines.py) and benchmark (benchmarks/autoscaling.py).

``Clients`` send a request function's requests (by default to the holding endpoint below); ``Watch`` samples
the HPA, the ready pods and the metric as functions of the release say (by default the workers').

The endpoint is the user's own code, a ClearML-style preprocess that holds each request ``SLEEP_S`` and
echoes its number: the requests in flight are then the clients' count, whatever the machine's speed,
and a worker, whose user code runs 8 calls at once, answers 16 clients in twice the time of 8.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from tests.deploy.kube.helm_release import NS, Release
from tests.support.procs import wait_until

HOLD = '''
import socket
import time


class Preprocess:
    """Holds each request ``sleep`` seconds (a model's time, without its CPU), answers its number and the pod."""

    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        time.sleep(float(body.get("sleep", 0)))
        return body

    def process(self, data, state, collect_custom_statistics_fn=None):
        return {"echo": data["i"], "pod": socket.gethostname()}
'''
SLEEP_S = 0.25
METRIC = "serving_worker_requests_in_flight"


def autoscaling_values(per_replica: int, most: int, down_window_s: int = 20) -> dict:
    """The workers' HPA on requests in flight, 1 to ``most`` replicas, quick both ways (a test's pace), and
    keep-alive connections recycled every 5 s, so the clients spread over new workers within seconds."""
    return {"metricsApi": {"enabled": True},
            "worker": {"maxConnectionAgeSeconds": 5, "autoscaling": {
                "enabled": True, "minReplicas": 1, "maxReplicas": most, "requestsInFlightPerReplica": per_replica,
                "targetCPUUtilizationPercentage": None,
                "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0,
                                         "policies": [{"type": "Pods", "value": most, "periodSeconds": 5}]},
                             "scaleDown": {"stabilizationWindowSeconds": down_window_s,
                                           "policies": [{"type": "Percent", "value": 100, "periodSeconds": 5}]}}}}}


def deploy_hold(release: Release, tmp: Path) -> None:
    """The holding endpoint ``slow``, a client key for it, answering behind the workers' Service."""
    hold = tmp / "hold.py"
    hold.write_text(HOLD)
    release.cli("model", "add", "--endpoint", "slow", "--engine", "custom", "--preprocess", str(hold))
    created = release.cli("key", "create", "--name", "load", "--endpoints", "slow").stdout
    release.client_key = next(w for w in created.split() if w.startswith("sk_"))

    def answers() -> bool:
        with release.worker() as c:
            return c.post("/serve/slow", json={"i": 0, "sleep": 0}).status_code == 200
    wait_until(answers, 180, "the slow endpoint answering behind the workers' Service", interval=1,
               on_timeout=release.describe)


Request = Callable[[httpx.Client, int], tuple[str, "str | None"]]  # (client, number) -> (outcome, answering pod)


def hold_request(client: httpx.Client, number: int) -> tuple[str, str | None]:
    """One call of the holding endpoint: ``ok`` when it echoes its own number."""
    r = client.post("/serve/slow", json={"i": number, "sleep": SLEEP_S})
    answer = r.json() if r.status_code == 200 else {}
    return ("ok" if answer.get("echo") == number else f"wrong: {r.status_code} {r.text[:200]}"), answer.get("pod")


@dataclass
class Clients:
    """Closed-loop clients through the workers' Service: ``count`` of them send at any time."""

    release: Release
    count: int = 0
    request: Request = hold_request
    results: list[tuple[float, float, str]] = field(default_factory=list)  # (sent at, latency, outcome); monotonic
    pods: list[tuple[float, str]] = field(default_factory=list)  # (sent at, the pod that answered)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _next: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self, most: int) -> "Clients":
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(most)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)

    def _run(self, index: int) -> None:
        with self.release.worker() as client:
            while not self._stop.is_set():
                if index >= self.count:
                    time.sleep(0.05)
                    continue
                with self._lock:
                    self._next += 1
                    number = self._next
                t0 = time.monotonic()
                try:
                    outcome, pod = self.request(client, number)
                    if pod:
                        self.pods.append((t0, pod))
                except httpx.HTTPError as exc:
                    outcome = f"lost: {type(exc).__name__}: {exc}"
                self.results.append((t0, time.monotonic() - t0, outcome))


@dataclass
class Sample:
    t: float               # monotonic
    clients: int
    desired: int           # the HPA's desired replicas (0 without an HPA)
    ready: int             # ready pods (the workers', or what Watch's ``ready`` counts)
    metric: float | None   # the external metric as the HPA reads it


class Watch:
    """Samples the HPA, the ready pods and the metric every second, in a thread (``metric`` None: not read)."""

    def __init__(self, release: Release, clients: Clients,
                 metric: Callable[[Release], float | None] | None = lambda r: external_metric(r),
                 ready: Callable[[Release], int] = lambda r: ready_workers(r)) -> None:
        self.release, self.clients, self.metric, self.ready = release, clients, metric, ready
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "Watch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def _run(self) -> None:
        while not self._stop.is_set():
            found = self.release.cluster.get("hpa", "-n", NS)["items"]
            desired = found[0].get("status", {}).get("desiredReplicas", 0) if found else 0
            self.samples.append(Sample(time.monotonic(), self.clients.count, desired, self.ready(self.release),
                                       self.metric(self.release) if self.metric else None))
            self._stop.wait(1.0)


def external_metric(release: Release, metric: str = METRIC, selector: str = "") -> float | None:
    """The metric as the HPA reads it: through the API server's aggregation layer (``selector``: its label
    selector, e.g. an LLM engine's ``serving.io/engine=<name>``)."""
    query = f"?labelSelector={selector.replace('=', '%3D')}" if selector else ""
    out = release.cluster.kubectl("get", "--raw", f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{NS}/{metric}{query}",
                                  check=False)
    if out.returncode != 0:
        return None
    value = json.loads(out.stdout)["items"][0]["value"]
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def ready_workers(release: Release) -> int:
    return ready_pods(release.pods("worker"))


def ready_pods(pods: list[dict]) -> int:
    return sum(1 for p in pods if p["metadata"].get("deletionTimestamp") is None
               and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])))


def percentile_ms(latencies: list[float], q: float) -> float:
    ordered = sorted(latencies)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))] * 1000 if ordered else float("nan")

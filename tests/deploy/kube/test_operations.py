"""Day-2 operations on the real cluster, each under a steady load through the workers' Service.

One install (helm_release.installed, ``triton.replicas=2``) and the tiny model deployed as ``clf``; then,
in order, with ``Load`` sending requests meanwhile (fresh connection each, every answer compared with
onnxruntime's for its text) and its counts printed per step:

1. Two Triton pods: both Ready and holding every deployed model, the worker's calls spread over both
   (each pod's own nv_inference_request_success); one Triton pod deleted, then one Triton container
   killed with SIGKILL: no request lost; the replacement loads the models itself before it is Ready
   and takes calls again.
2. ``helm upgrade --reuse-values --set worker.replicas=3``: every worker pod holds the control
   plane's config revision and answers a share of the load (each pod's /v2/models/clf/stats).
3. A rolling upgrade of the workers (a pod annotation, which rolls every Deployment of the chart: both
   Triton pods too): no request lost (preStop sleeps, readiness, the workers' lookup of the new Triton
   pods when every one they knew is gone).
4. A worker pod deleted: no request lost.
5. A worker container killed with SIGKILL: it comes back by itself; the requests it had in flight
   may fail, and are counted.
6. The control-plane pod deleted: the workers keep answering (no request lost), reconnect, and a
   canary added once it is back reaches every worker; the models and artifacts are still there.
7. Two control planes (``controlPlane.replicas=2`` on the chart's PostgreSQL; docs/high-availability.md): one
   leads; a rollout of the canary is started, and the leader's pod is deleted mid-rollout: another (the other
   replica, or the deleted one's replacement when it is up first) takes
   over within seconds and the rollout finishes once (each step in its history once), no request lost, and
   the CLI and the console (a session signed in before) answer through the Service throughout. A change made through either replica
   reaches every worker (each pod's /status revision) within a second.

A connection refused (nothing was sent) is tried again by the load, for up to 15 s, each attempt
counted as "retried"; any other failure, or a connection still refused after that, is "lost". The
graceful steps (a rolling upgrade, a deleted worker pod) must not have a connection refused either.
"""
from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
import pytest

from tests.deploy.kube.helm_release import NS, RELEASE, Release, deploy_clf, installed
from tests.deploy.reference import reference_logits
from tests.support.background import Background
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(2400)

TEXTS = ["the service was quick and the staff were friendly", "terrible food and a rude waiter",
         "an average evening, nothing special", "i would come back again tomorrow"]
RATE = 12.0  # requests per second, over two threads
# A connection refused (a killed worker container's pod IP, until it leaves the Service's endpoints or
# listens again) is tried again, 0.3 s apart, for up to this long; each attempt is counted as "retried".
REFUSED_RETRY_S = 15.0
STEPS: list[tuple[str, "Counts", str]] = []


@dataclass
class Counts:
    sent: int = 0
    ok: int = 0
    lost: int = 0
    wrong: int = 0
    retried: int = 0
    failures: list[str] = field(default_factory=list)

    def minus(self, before: "Counts") -> "Counts":
        return Counts(self.sent - before.sent, self.ok - before.ok, self.lost - before.lost,
                      self.wrong - before.wrong, self.retried - before.retried, self.failures[len(before.failures):])

    def row(self) -> str:
        return f"{self.sent:>6} {self.ok:>6} {self.lost:>5} {self.wrong:>6} {self.retried:>8}"


class Load:
    """Requests at a steady rate to /serve/clf through the workers' Service, from two threads."""

    def __init__(self, release: Release, expected: dict[str, np.ndarray], threads: int = 2) -> None:
        self.url = release.service_url("worker", 9090) + "/serve/clf"
        self.headers = {"Authorization": f"Bearer {release.client_key}", "Connection": "close"}
        self.expected = expected
        self.counts = Counts()
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i, threads), daemon=True) for i in range(threads)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(60)

    def _one(self, text: str) -> None:
        first = time.monotonic()
        while True:
            try:
                r = httpx.post(self.url, json={"text": text}, headers=self.headers, timeout=30)
            except httpx.ConnectError as exc:  # refused: nothing was sent, so a client may try again
                if time.monotonic() - first < REFUSED_RETRY_S:
                    with self.lock:
                        self.counts.retried += 1
                    time.sleep(0.3)
                    continue
                self._fail(f"connect: {exc}")
                return
            except httpx.HTTPError as exc:
                self._fail(f"{type(exc).__name__}: {exc}")
                return
            if r.status_code != 200:
                self._fail(f"{r.status_code}: {r.text[:200]}")
                return
            good = np.allclose(r.json()["logits"], self.expected[text], atol=1e-4)
            with self.lock:
                self.counts.ok += good
                self.counts.wrong += not good
            return

    def _fail(self, why: str) -> None:
        with self.lock:
            self.counts.lost += 1
            if len(self.counts.failures) < 8:
                self.counts.failures.append(f"{time.strftime('%H:%M:%S')} {why}")

    def _run(self, index: int, threads: int) -> None:
        period = threads / RATE
        due = time.monotonic() + index * period / threads
        n = index
        while not self.stopping.is_set():
            due += period
            text = TEXTS[n % len(TEXTS)]
            n += 1
            with self.lock:
                self.counts.sent += 1
            self._one(text)
            time.sleep(max(0.0, due - time.monotonic()))

    def snapshot(self) -> Counts:
        with self.lock:
            return Counts(**{**self.counts.__dict__, "failures": list(self.counts.failures)})


def record(step: str, counts: Counts, note: str = "") -> None:
    STEPS.append((step, counts, note))
    print(f"\n{step}: sent {counts.sent} ok {counts.ok} lost {counts.lost} wrong {counts.wrong} "
          f"retried {counts.retried} {note}\n" + "\n".join(counts.failures))


@pytest.fixture(scope="module")
def release(kube_cluster, platform_images_in_node, tmp_path_factory, tiny_model):
    start = time.monotonic()
    with installed(kube_cluster, platform_images_in_node, tmp_path_factory.mktemp("helm"),
                   {"triton": {"replicas": 2}}) as rel:
        deploy_clf(rel, tiny_model)
        kube_cluster.timings["install and deploy"] = time.monotonic() - start
        yield rel
    print("\nstep                                   sent     ok  lost  wrong  retried  note")
    for step, counts, note in STEPS:
        print(f"{step:<38} {counts.row()}  {note}")


@pytest.fixture(scope="module")
def expected(tiny_model) -> dict[str, np.ndarray]:
    logits = reference_logits(tiny_model, TEXTS)
    return dict(zip(TEXTS, logits))


# ---- helpers on the cluster


def ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def running_pods(release: Release, component: str) -> list[dict]:
    return [p for p in release.pods(component) if not p["metadata"].get("deletionTimestamp")]


def wait_pods_ready(release: Release, component: str, count: int, timeout: float = 300,
                    exclude: set[str] = frozenset()) -> list[dict]:
    """``count`` pods of ``component`` Ready and none other left (terminating ones gone)."""
    found: list[dict] = []

    def done() -> bool:
        nonlocal found
        pods = release.pods(component)
        found = [p for p in pods if ready(p) and p["metadata"]["name"] not in exclude
                 and not p["metadata"].get("deletionTimestamp")]
        return len(found) == count and len(pods) == count
    wait_until(done, timeout, f"{count} {component} pods Ready", interval=1, on_timeout=release.describe)
    return found


def triton_models(pod: dict) -> set[str]:
    """The models this Triton pod's loader reports loaded (its GET /ready), each one ready in the pod's
    tritonserver itself (/v2/models/<name>/ready; the repository index is a restricted API)."""
    ip = pod["status"]["podIP"]
    report = httpx.get(f"http://{ip}:8005/ready", timeout=10).json()
    return {name for name in report.get("loaded", [])
            if httpx.get(f"http://{ip}:8000/v2/models/{name}/ready", timeout=10).status_code == 200}


def triton_successes(pod: dict) -> float:
    text = httpx.get(f"http://{pod['status']['podIP']}:8002/metrics", timeout=10).text
    return sum(float(v) for v in re.findall(r"^nv_inference_request_success\{[^}]*\} (\S+)$", text, re.M))


def worker_served(release: Release, pod: dict) -> int:
    """Requests this worker pod answered for clf (its processes' statistics)."""
    r = httpx.get(f"http://{pod['status']['podIP']}:9090/v2/models/clf/stats", timeout=10,
                  headers={"Authorization": f"Bearer {release.client_key}"})
    r.raise_for_status()
    return sum(int(s["inference_stats"]["success"]["count"]) for s in r.json()["model_stats"])


def kill_container(release: Release, pod: dict) -> int:
    """SIGKILL to the pod's first container's main process, found through containerd: its pid."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    tasks = release.cluster.ctr("task", "ls").stdout
    (pid,) = [int(line.split()[1]) for line in tasks.splitlines()[1:] if line.split()[0] == cid]
    os.kill(pid, signal.SIGKILL)
    return pid


def restarts(pod: dict) -> int:
    return pod["status"]["containerStatuses"][0]["restartCount"]


def settle(seconds: float) -> None:
    time.sleep(seconds)  # load keeps running: a period of requests after the change, counted in the step


def control_plane_get(release: Release, path: str) -> httpx.Response:
    r = httpx.get(release.service_url("control-plane", 8080) + path, timeout=30,
                  headers={"Authorization": f"Bearer {release.admin_token}"})
    r.raise_for_status()
    return r


# ---- the steps, in order


def test_1_two_triton_pods_hold_the_models_share_the_calls_and_lose_none_when_one_goes(release, expected):
    pods = wait_pods_ready(release, "triton", 2)
    models = [triton_models(p) for p in pods]
    assert models[0] and models[0] == models[1], models
    before = {p["metadata"]["name"]: triton_successes(p) for p in pods}
    with Load(release, expected) as load:
        settle(8)
        after = {p["metadata"]["name"]: triton_successes(p) for p in pods}
        spread = {n: after[n] - before[n] for n in after}
        assert all(v > 0 for v in spread.values()), spread
        first = load.snapshot()
        record("1a two Triton pods, spread", first, f"calls per pod {spread}")

        # one deleted
        victim = pods[0]["metadata"]["name"]
        release.cluster.kubectl("delete", "pod", "-n", NS, victim, "--wait=false")
        new = watch_replacement(release, {p["metadata"]["name"] for p in pods}, models[1])
        second = load.snapshot()
        counts = second.minus(first)
        record("1b Triton pod deleted", counts, f"{victim} -> {new['metadata']['name']}")
        assert counts.lost == 0 and counts.wrong == 0, counts

        # the replacement takes calls again
        start = triton_successes(new)
        wait_until(lambda: triton_successes(new) > start, 60, "calls on the new Triton pod", interval=1)

        # one killed
        pods = wait_pods_ready(release, "triton", 2)
        target = pods[0]
        was = restarts(target)
        pid = kill_container(release, target)
        wait_until(lambda: restarts(release.cluster.get("pod", target["metadata"]["name"], "-n", NS)) > was
                   and ready(release.cluster.get("pod", target["metadata"]["name"], "-n", NS)),
                   240, "the killed Triton container restarted and Ready", interval=1, on_timeout=release.describe)
        back = release.cluster.get("pod", target["metadata"]["name"], "-n", NS)
        assert triton_models(back) >= models[1]
        start = triton_successes(back)
        wait_until(lambda: triton_successes(back) > start, 60, "calls on the restarted Triton", interval=1)
    counts = load.snapshot().minus(second)
    record("1c Triton container SIGKILL", counts, f"pid {pid} of {target['metadata']['name']}")
    assert counts.lost == 0 and counts.wrong == 0, counts
    assert first.lost == 0 and first.wrong == 0, first


def watch_replacement(release: Release, old: set[str], models: set[str]) -> dict:
    """The Triton pod that replaces a deleted one: never Ready without every model; returned once Ready."""
    seen: dict = {}

    def replaced() -> bool:
        for pod in release.pods("triton"):
            if pod["metadata"]["name"] in old or not pod["status"].get("podIP"):
                continue
            if ready(pod):
                held = triton_models(pod)
                assert held >= models, f"{pod['metadata']['name']} Ready holding {held}, not {models}"
                seen["pod"] = pod
                return True
        return False
    wait_until(replaced, 240, "a replacement Triton pod Ready", interval=0.5, on_timeout=release.describe)
    return seen["pod"]


def test_2_three_workers_hold_the_current_config_and_share_the_load(release, expected):
    with Load(release, expected) as load:
        release.helm("upgrade", RELEASE, str(release_chart()), "--reuse-values", "--set", "worker.replicas=3",
                     "--wait", "--timeout", "5m", timeout=400)
        pods = wait_pods_ready(release, "worker", 3)
        revision = control_plane_get(release, "/config").json()["revision"]

        def revisions() -> list:
            return [httpx.get(f"http://{p['status']['podIP']}:9090/status", timeout=10).json()["revision"]
                    for p in pods]
        wait_until(lambda: revisions() == [revision] * 3, 60, f"revision {revision} on every worker", interval=1)
        before = {p["metadata"]["name"]: worker_served(release, p) for p in pods}
        settle(10)
        served = {p["metadata"]["name"]: worker_served(release, p) - before[p["metadata"]["name"]] for p in pods}
    counts = load.snapshot()
    record("2 workers scaled to 3", counts, f"answers per pod in 10 s {served}")
    assert all(v > 0 for v in served.values()), served
    assert counts.lost == 0 and counts.wrong == 0, counts


def release_chart():
    from tests.deploy.artifacts import CHART
    return CHART


def test_3_a_rolling_upgrade_of_the_workers_loses_no_request(release, expected):
    old = {p["metadata"]["name"] for p in release.pods("worker")}
    old_triton = {p["metadata"]["name"] for p in release.pods("triton")}
    with Load(release, expected) as load:
        release.helm("upgrade", RELEASE, str(release_chart()), "--reuse-values",
                     "--set-string", "podAnnotations.rolled=" + str(int(time.time())),
                     "--wait", "--timeout", "6m", timeout=450)
        pods = wait_pods_ready(release, "worker", 3, exclude=old)
        tritons = wait_pods_ready(release, "triton", 2, exclude=old_triton)
        settle(3)
    counts = load.snapshot()
    record("3 rolling upgrade of 3 workers and 2 Triton pods", counts,
           f"new pods {sorted(p['metadata']['name'] for p in [*pods, *tritons])}")
    assert counts.lost == 0 and counts.wrong == 0 and counts.retried == 0, counts


def test_4_a_worker_pod_deleted_loses_no_request(release, expected):
    victim = running_pods(release, "worker")[0]["metadata"]["name"]
    with Load(release, expected) as load:
        settle(2)
        release.cluster.kubectl("delete", "pod", "-n", NS, victim, "--wait=false")
        wait_pods_ready(release, "worker", 3, exclude={victim}, timeout=240)
        settle(3)
    counts = load.snapshot()
    record("4 worker pod deleted", counts, victim)
    assert counts.lost == 0 and counts.wrong == 0 and counts.retried == 0, counts


def test_5_a_killed_worker_container_comes_back_and_only_its_requests_in_flight_fail(release, expected):
    target = running_pods(release, "worker")[0]
    name = target["metadata"]["name"]
    was = restarts(target)
    with Load(release, expected) as load:
        settle(2)
        pid = kill_container(release, target)
        wait_until(lambda: restarts(release.cluster.get("pod", name, "-n", NS)) > was
                   and ready(release.cluster.get("pod", name, "-n", NS)),
                   240, "the killed worker restarted and Ready", interval=1, on_timeout=release.describe)
        settle(3)
    counts = load.snapshot()
    record("5 worker container SIGKILL", counts, f"pid {pid} of {name}; lost: its requests in flight")
    assert counts.wrong == 0, counts
    # at most the two load threads' requests in flight at the moment of the kill
    assert counts.lost <= 2, counts


def test_6_the_control_plane_pod_deleted(release, expected, tiny_model):
    (cp,) = running_pods(release, "control-plane")
    with Load(release, expected) as load:
        settle(2)
        release.cluster.kubectl("delete", "pod", "-n", NS, cp["metadata"]["name"], "--wait=false")
        wait_pods_ready(release, "control-plane", 1, exclude={cp["metadata"]["name"]}, timeout=240)
        # a change once it is back reaches every worker
        release.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        release.cli("model", "add", "--endpoint", "clf", "--model", "clf:2", "--tokenizer",
                    str(tiny_model.tokenizer_dir), "--labels", ",".join(tiny_model.labels), "--canary", "10%")
        revision = control_plane_get(release, "/config").json()["revision"]
        workers = running_pods(release, "worker")

        def weights(pod: dict) -> dict:
            status = httpx.get(f"http://{pod['status']['podIP']}:9090/status", timeout=10).json()
            return {"revision": status["revision"],
                    "versions": sorted(v["version"] for v in status["endpoints"]["clf"]["versions"])}
        wait_until(lambda: all(weights(p) == {"revision": revision, "versions": [1, 2]} for p in workers), 120,
                   "the canary on every worker", interval=1, on_timeout=lambda: str([weights(p) for p in workers]))
        settle(3)
    counts = load.snapshot()
    record("6 control plane deleted", counts, f"canary at revision {revision} on {len(workers)} workers")
    assert counts.lost == 0 and counts.wrong == 0, counts
    listed = release.cli("model", "list").stdout
    assert "clf" in listed, listed
    models = control_plane_get(release, "/models?name=clf").json()
    assert {m["version"] for m in models} >= {1, 2}, models
    sha = models[0]["sha256"]
    body = control_plane_get(release, f"/artifacts/{sha}").content
    assert hashlib.sha256(body).hexdigest() == sha


def leads(pod: dict) -> bool | None:
    try:
        return bool(httpx.get(f"http://{pod['status']['podIP']}:8080/leadership", timeout=3).json()["leader"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def worker_revisions(release: Release) -> set[int]:
    return {httpx.get(f"http://{p['status']['podIP']}:9090/status", timeout=5).json()["revision"]
            for p in running_pods(release, "worker")}


class Probes(Background):
    """The CLI (``serving endpoint list``) and a console page, signed in once before, through the control plane's
    Service, one after the other until stopped: what an operator sees during a failover. The Service spreads
    them over both replicas, and the console session (in the database) must hold on each, and on the pod
    that replaces the deleted one."""

    def __init__(self, release: Release) -> None:
        super().__init__("probes")
        self.release, self.ok, self.failed = release, 0, []

    def run(self) -> None:
        console = self.release.service_url("control-plane", 8080) + "/console"
        signed = httpx.post(f"{console}/signin", data={"token": self.release.admin_token}, timeout=10)
        if signed.status_code != 303:
            self.failed.append(f"console sign-in {signed.status_code}: {signed.text[:200]}")
            return
        cookies = dict(signed.cookies)
        while not self.stopping.is_set():
            try:
                self.release.cli("endpoint", "list")
                page = httpx.get(f"{console}/", cookies=cookies, timeout=10)
                assert page.status_code == 200, f"console page {page.status_code} {page.headers.get('location')}"
                self.ok += 1
            except (AssertionError, httpx.HTTPError) as exc:
                self.failed.append(f"{time.strftime('%H:%M:%S')} {exc}"[:300])
            time.sleep(0.5)


def test_7_two_control_planes_the_leader_deleted_mid_rollout(release, expected):
    release.helm("upgrade", RELEASE, str(release_chart()), "--reuse-values", "--set", "controlPlane.replicas=2",
                 "--wait", "--timeout", "6m", timeout=450)
    pods = wait_pods_ready(release, "control-plane", 2)
    wait_until(lambda: sorted(leads(p) for p in pods) == [False, True], 30, "one control plane leading",
               interval=0.5, on_timeout=lambda: str([leads(p) for p in pods]))
    (leader,) = [p for p in pods if leads(p)]
    (other,) = [p for p in pods if p is not leader]
    with Load(release, expected) as load, Probes(release) as probes:
        settle(2)
        release.cli("rollout", "start", "--endpoint", "clf", "--model", "clf:2", "--steps", "25,50,100",
                    "--interval", "10s")
        rollout = lambda: control_plane_get(release, "/rollouts?endpoint=clf").json()[0]  # noqa: E731
        wait_until(lambda: rollout()["step"] >= 1, 120, "the rollout's first step passed", interval=0.5,
                   on_timeout=lambda: str(rollout()))
        deleted = time.monotonic()
        release.cluster.kubectl("delete", "pod", "-n", NS, leader["metadata"]["name"], "--wait=false")
        successor: list[str] = []

        def taken_over() -> bool:  # the other replica, or the pod replacing the deleted one if it is first
            successor[:] = [p["metadata"]["name"] for p in running_pods(release, "control-plane")
                            if p["metadata"]["name"] != leader["metadata"]["name"] and p["status"].get("podIP")
                            and leads(p)]
            return bool(successor)
        wait_until(taken_over, 60, "another control plane leading", interval=0.2,
                   on_timeout=lambda: str([(p["metadata"]["name"], leads(p)) for p in release.pods("control-plane")]))
        takeover_s = time.monotonic() - deleted
        wait_until(lambda: rollout()["state"] != "running", 180, "the rollout finished", interval=1,
                   on_timeout=lambda: str(rollout()))
        pods = wait_pods_ready(release, "control-plane", 2, exclude={leader["metadata"]["name"]})
        settle(3)
    counts, done = load.snapshot(), rollout()
    passed = [e["step"] for e in done["history"] if e["event"] == "gates passed"]
    who = "the other replica" if successor == [other["metadata"]["name"]] else "its replacement"
    record("7 leader deleted mid-rollout", counts, f"{who} led {takeover_s:.1f} s after the delete; rollout "
           f"{done['state']}, steps passed {passed}; CLI and console {probes.ok} ok, {len(probes.failed)} failed")
    assert done["state"] == "succeeded", done
    assert passed == sorted(set(passed)) and passed == [1, 2], done["history"]  # each step once, none lost
    assert sum(e["event"].startswith("promoted") for e in done["history"]) == 1, done["history"]
    assert counts.lost == 0 and counts.wrong == 0, counts
    assert probes.ok and not probes.failed, probes.failed
    assert takeover_s < 30, takeover_s

    # a change through either replica reaches every worker within a second (NOTIFY; the workers stream from both)
    latencies = []
    for pod in pods * 2:
        revision = max(worker_revisions(release))
        url = f"http://{pod['status']['podIP']}:8080"
        out = subprocess.run([sys.executable, "-m", "serving.cli.main", "--control-plane", url, "endpoint", "log",
                              "--endpoint", "clf", "--sample", f"{len(latencies) + 1}%"], capture_output=True,
                             text=True, timeout=60, env={**os.environ, "SERVING_TOKEN": release.admin_token})
        assert out.returncode == 0, out.stdout + out.stderr
        start = time.monotonic()
        wait_until(lambda: min(worker_revisions(release)) > revision, 10, "the change on every worker", interval=0.05)
        latencies.append(time.monotonic() - start)
    print(f"\nchanges through either control plane on every worker after {[round(x, 2) for x in latencies]} s")
    assert max(latencies) < 1.0, latencies

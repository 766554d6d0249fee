"""Scale to zero in the launcher on Kubernetes (serving/llm/kube/engines.py, idle.py): an idle engine goes to zero
replicas, a wake puts them back, the cold start is measured from the Deployment's wake time to the pod's Ready, and
only the launcher that acts (the leading control plane's) changes the cluster.

The API and the pods' metrics are stand-ins here (a dict of Deployments with merge-patch semantics; vLLM's
metric lines as text), and time is a counter: what a real API server and real vLLM pods do is in the cluster
test (tests/deploy/kube/test_scale_to_zero.py)."""
from __future__ import annotations

import time
from datetime import datetime, timezone

from serving.llm.kube import manifests
from serving.llm.kube.engines import KubeEngines
from serving.llm.kube.idle import ASLEEP_ANNOTATION, WOKEN_ANNOTATION, ColdStarts, IdleClocks, finished
from serving.llm.kube.template import EngineTemplate

TEMPLATE = EngineTemplate.model_validate({"release": "demo-serving", "image": "vllm:1", "initImage": "serving:1",
                                          "controlPlaneUrl": "http://cp:8080"})
NAME = manifests.engine_name("demo-serving", "chat:1")


def snapshot(after_s: int | None = 30) -> dict:
    options = {"scale_to_zero_after_s": after_s} if after_s else {}
    return {"revision": 1, "endpoints": {"chat": {"engine": "vllm", "engine_options": options,
                                                  "targets": [{"model": "chat", "version": 1, "artifact": "a" * 64}]}}}


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class StandInAPI:
    namespace = "ml"

    def __init__(self) -> None:
        self.deployments: dict[str, dict] = {}
        self.services: set[str] = set()
        self.ready_at: dict[str, float] = {}  # when each Deployment's pods became Ready
        self.writes: list[tuple[str, dict]] = []

    def get(self, path: str, params: dict | None = None) -> dict:
        if path.endswith("/deployments"):
            return {"items": list(self.deployments.values())}
        if path.endswith("/services"):
            return {"items": [{"metadata": {"name": n}} for n in self.services]}
        if path.endswith("/pods"):
            return {"items": [{"metadata": {"name": f"{n}-{i}", "labels": {"serving.io/engine": n}},
                               "status": {"podIP": f"10.0.0.{i + 9}", "conditions": [
                                   {"type": "Ready", "status": "True", "lastTransitionTime": iso(self.ready_at[n])}]}}
                              for n, d in self.deployments.items() for i in range(d["spec"]["replicas"])
                              if n in self.ready_at]}
        return {"items": []}

    def request(self, method: str, path: str, body: dict | None = None, params=None, missing_ok=False) -> dict:
        name = path.rsplit("/", 1)[1]
        if method == "POST" and body["kind"] == "Deployment":
            self.deployments[body["metadata"]["name"]] = body
        elif method == "POST" and body["kind"] == "Service":
            self.services.add(body["metadata"]["name"])
        elif method == "PATCH":
            self.writes.append((method, body))
            d = self.deployments[name]
            for k, v in body["metadata"]["annotations"].items():
                if v is None:
                    d["metadata"]["annotations"].pop(k, None)
                else:
                    d["metadata"]["annotations"][k] = v
            d["spec"]["replicas"] = body["spec"]["replicas"]
            if body["spec"]["replicas"] == 0:
                self.ready_at.pop(name, None)
        elif method == "PUT":
            self.writes.append((method, body))
            self.deployments[name] = body
        return {}


class Engines:
    """What the pods' /metrics say: requests finished so far, and in the queue."""

    def __init__(self) -> None:
        self.done, self.queue = 0, 0

    def read(self, url: str) -> bytes:
        return (f'vllm:num_requests_running{{engine="0"}} {self.queue}\n'
                f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {self.done}\n').encode()


def launcher(api: StandInAPI, pods: Engines, now: list[float], acts: bool = True,
             measured: list | None = None) -> KubeEngines:
    out = KubeEngines(api, TEMPLATE, acts=lambda: acts, idle=IdleClocks(pods.read, clock=lambda: now[0]),
                      cold_starts=ColdStarts(lambda key, s: measured.append((key, s)) if measured is not None else None))
    out.apply(snapshot())
    return out


def tick(launcher: KubeEngines) -> dict:
    launcher._due = 0.0
    launcher.tick()
    return launcher.view()["engines"]["chat:1"]


def test_vllm_counts_are_read_from_its_metric_lines():
    text = (b'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0\n'
            b'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 4.0\n'
            b'vllm:request_success_created{engine="0"} 1.7e9\n')
    assert finished(text) == 7.0


def test_an_idle_engine_sleeps_a_wake_brings_it_back_and_its_cold_start_is_measured():
    api, pods, now, measured = StandInAPI(), Engines(), [time.time()], []
    one = launcher(api, pods, now, measured=measured)
    tick(one)
    api.ready_at[NAME] = now[0]
    assert tick(one)["state"] == "ready"
    for _ in range(4):  # working: a request finished every 20 s, so never 30 s idle
        now[0] += 20
        pods.done += 1
        assert tick(one)["state"] == "ready"
    pods.queue = 1  # one long request: nothing finishes, but it is not idle either
    now[0] += 40
    assert tick(one)["state"] == "ready"
    pods.queue = 0
    now[0] += 29
    assert tick(one)["state"] == "ready" and not api.writes
    now[0] += 2
    tick(one)
    d = api.deployments[NAME]
    assert d["spec"]["replicas"] == 0 and ASLEEP_ANNOTATION in d["metadata"]["annotations"]
    view = tick(one)
    assert view["state"] == "scaled_to_zero" and view["replicas"] == [] and view["scale_to_zero_after_s"] == 30

    woken = one.wake("chat:1")
    assert woken == {"engine": "chat:1", "state": "starting"}
    d = api.deployments[NAME]
    assert d["spec"]["replicas"] == 1 and ASLEEP_ANNOTATION not in d["metadata"]["annotations"]
    at = float(d["metadata"]["annotations"][WOKEN_ANNOTATION])
    assert one.wake("chat:1") == {"engine": "chat:1", "state": "starting"}  # every held request asks
    assert len([w for w in api.writes if w[0] == "PATCH"]) == 2, "one sleep and one wake"
    view = tick(one)
    assert view["state"] == "starting" and view["waking"] is True  # no pod Ready yet
    api.ready_at[NAME] = at + 27
    view = tick(one)
    assert view["state"] == "ready" and "waking" not in view
    (key, seconds), = measured
    assert key == "chat:1" and 26 <= seconds <= 27 and view["cold_start_s"] == round(seconds, 1)
    now[0] += 29  # woken: a whole idle period before it may sleep again
    assert tick(one)["state"] == "ready" and api.deployments[NAME]["spec"]["replicas"] == 1


def test_an_engine_without_the_option_never_sleeps_and_an_unknown_one_cannot_be_woken():
    api, pods, now = StandInAPI(), Engines(), [time.time()]
    one = launcher(api, pods, now)
    one.apply(snapshot(after_s=None))
    tick(one)
    api.ready_at[NAME] = now[0]
    now[0] += 3600
    assert tick(one)["state"] == "ready" and api.deployments[NAME]["spec"]["replicas"] == 1
    assert one.wake("other:1") is None


def test_only_the_launcher_that_acts_changes_the_cluster_and_another_ones_wake_resets_its_idle_clock():
    api, pods, now = StandInAPI(), Engines(), [time.time()]
    follower = launcher(api, pods, now, acts=False)
    tick(follower)
    assert api.deployments == {}, "a launcher whose control plane does not lead creates nothing"
    leader = launcher(api, pods, now)
    tick(leader)
    api.ready_at[NAME] = now[0]
    assert tick(leader)["state"] == tick(follower)["state"] == "ready"
    now[0] += 31
    tick(follower)
    assert api.deployments[NAME]["spec"]["replicas"] == 1, "the follower puts nothing to sleep"
    tick(leader)
    assert api.deployments[NAME]["spec"]["replicas"] == 0
    assert tick(follower)["state"] == "scaled_to_zero"
    # the worker's wake reached the follower (the launchers' Service spreads them): any launcher may wake
    assert follower.wake("chat:1")["state"] == "starting"
    api.ready_at[NAME] = float(api.deployments[NAME]["metadata"]["annotations"][WOKEN_ANNOTATION]) + 5
    now[0] += 5
    assert tick(leader)["state"] == "ready"
    now[0] += 20  # the leader's own clock last saw work long ago: the wake time counts as work
    assert tick(leader)["state"] == "ready" and api.deployments[NAME]["spec"]["replicas"] == 1


def test_a_slow_start_is_not_idle_time_and_a_pod_first_seen_counts_as_working():
    """The cluster run found it: the idle clock ran from the engine's creation through its 30 s start, and a
    pod first seen with its first request already finished looked unchanged, so the engine slept at once."""
    api, pods, now = StandInAPI(), Engines(), [time.time()]
    one = launcher(api, pods, now)
    tick(one)
    for _ in range(4):  # 40 s starting: no pod ready yet
        now[0] += 10
        assert tick(one)["state"] == "starting"
    api.ready_at[NAME] = now[0]
    pods.done = 1  # its first request came and went before the launcher's first look at the pod
    now[0] += 2
    assert tick(one)["state"] == "ready"
    now[0] += 29
    assert tick(one)["state"] == "ready" and api.deployments[NAME]["spec"]["replicas"] == 1
    now[0] += 2
    tick(one)
    assert api.deployments[NAME]["spec"]["replicas"] == 0  # idle 31 s since it was first seen working

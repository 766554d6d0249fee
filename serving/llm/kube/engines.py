"""The launcher of a cluster: engines as Deployments, with the one-machine launcher's face.

``serving llm`` with ``SERVING_LLM_ON_KUBERNETES=true`` (the chart runs it in the control plane's pod,
with RBAC on Deployments, Services and Pods of its namespace) takes this in place of launch/launcher.py:
the same ``apply`` (a snapshot), ``tick``, ``view`` (``GET /engines``) and ``readiness``.

- ``tick`` reconciles at most every ``RECONCILE_S``: it creates the Deployment and Service of an engine
  a snapshot wants, replaces a Deployment whose pods should run something else (rolling, see
  manifests.py), sets its replicas, and deletes the engines of this release no snapshot wants any more.
  What it made is found again by labels, so a restarted control plane adopts its engines, not restarts them.
- ``view`` lists each engine's pods as its replicas: ``ready`` by the pod's Ready condition (vLLM's
  ``/health`` as readiness probe), ``failed`` with the reason kubelet gives (an image that cannot be
  pulled, a crash loop, the model folder not fetched), else ``starting``. Workers route over the ready
  ones by the endpoint's policy, as over local replicas.
- Scale to zero (idle.py): an engine whose endpoint sets ``scale_to_zero_after_s`` and whose pods did no work
  for that long goes to 0 replicas, marked by an annotation; its view is ``scaled_to_zero``. ``wake`` (a
  worker holding a request for it: ``POST /engines/wake``) puts its replicas back at once; the view is
  ``starting`` with ``waking`` until a pod is Ready, and the cold start is measured.
- Only the process that ``acts`` (the leading control plane's launcher, when there are two) creates,
  replaces, deletes or puts engines to sleep; every one reads the pods and answers ``GET /engines``, and
  any one may wake an engine (idempotent).
- A failing Kubernetes API leaves the engines as they are: the workers keep the last map read (the pods
  serve without the API), and an engine not read yet is failed with the API's error, so ``serving model add
  --wait`` says why; the next tick tries again.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from serving.kube_api import InCluster, KubeError
from serving.llm.kube import manifests
from serving.llm.kube.idle import ASLEEP_ANNOTATION, WOKEN_ANNOTATION, ColdStarts, IdleClocks
from serving.llm.kube.template import EngineTemplate
from serving.llm.launch.process import EngineSpec, wanted_engines
from serving.llm.launch.sleep import engine_states
from serving.settings import LLMSettings

log = logging.getLogger(__name__)

RECONCILE_S = 2.0
WAKE_AGAIN_S = 10.0  # a wake this process sent is not sent again sooner (every held request asks)
# a container waiting for one of these will not start by itself
STUCK = {"CrashLoopBackOff", "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
         "CreateContainerError", "RunContainerError"}


@dataclass(frozen=True)
class Made:
    """An engine's Deployment as the reconcile left it."""

    pod_hash: str | None
    asleep: bool = False
    woken_at: float | None = None  # the last wake call's Unix time (idle.py WOKEN_ANNOTATION)

    @classmethod
    def of(cls, body: dict[str, Any], current: dict[str, Any] | None) -> "Made":
        """``body``: the Deployment as it should be; ``current``: as the API had it (None: not made yet)."""
        return cls(_hash(body), _asleep(current), _woken_at(current))


class KubeEngines:
    def __init__(self, api: InCluster, template: EngineTemplate, kv_cache_gb: float | None = None,
                 on_change: Callable[[], None] = lambda: None, acts: Callable[[], bool] = lambda: True,
                 idle: IdleClocks | None = None, cold_starts: ColdStarts | None = None) -> None:
        self.api, self.template, self.kv_cache_gb = api, template, kv_cache_gb
        self.on_change, self.acts = on_change, acts
        self.idle = idle or IdleClocks()
        self.cold_starts = cold_starts or ColdStarts()
        self._writes = threading.Lock()  # a wake and a reconcile do not write the same Deployment at once
        self._wakes_sent: dict[str, float] = {}  # engine key -> when this process last woke it (monotonic)
        self.wanted: dict[str, EngineSpec] = {}
        self.revision = -1
        self.lock = threading.Lock()
        self._views: dict[str, dict[str, Any]] = {}
        self._api_error: str | None = None
        self._due = 0.0
        self._owner: dict[str, Any] | None = None

    @classmethod
    def from_settings(cls, settings: LLMSettings, on_change: Callable[[], None] = lambda: None,
                      acts: Callable[[], bool] = lambda: True, cold_starts: ColdStarts | None = None) -> "KubeEngines":
        api = InCluster.from_pod()
        if api is None:
            raise RuntimeError("SERVING_LLM_ON_KUBERNETES is set but this is no pod with a service account token")
        return cls(api, EngineTemplate.model_validate(settings.llm_kube_engine), settings.vllm_kv_cache_gb, on_change,
                   acts, cold_starts=cold_starts)

    def apply(self, snapshot: dict[str, Any]) -> None:
        with self.lock:
            self.wanted = wanted_engines(snapshot)
            self.revision = int(snapshot.get("revision", -1))
            self._due = 0.0

    # --- the loop ---------------------------------------------------------------------
    def tick(self) -> None:
        if time.monotonic() < self._due:
            return
        self._due = time.monotonic() + RECONCILE_S
        with self.lock:
            wanted = dict(self.wanted)
        acts = self.acts()  # asked once a tick: a reconcile and a sleep decision of the same leader
        try:
            with self._writes:
                made = self._reconcile(wanted, write=acts)
            views = self._read(wanted, made)
            if acts:
                self._sleep_idle(wanted, views, made)
            error = None
        except KubeError as exc:  # the pods go on serving: keep the last map read, and say why it is old
            log.warning("engines on Kubernetes: %s", exc)
            views, error = self._views, f"the Kubernetes API: {exc}"
        changed = {k: v["state"] for k, v in views.items()} != {k: v["state"] for k, v in self._views.items()} \
            or error != self._api_error
        with self.lock:
            self._views, self._api_error = views, error
        if changed:
            self.on_change()

    def _reconcile(self, wanted: dict[str, EngineSpec], write: bool = True) -> dict[str, Made]:
        """Make the cluster hold what ``wanted`` asks for (``write``: only read it, when another launcher
        acts); each engine's Deployment as it is now (by engine name)."""
        ns, t = self.api.namespace, self.template
        if t.owner and self._owner is None:
            self._owner = self.api.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{t.owner}")
        params = {"labelSelector": manifests.label_selector(manifests.selector(t.release))}
        have = {d["metadata"]["name"]: d for d in
                self.api.get(f"/apis/apps/v1/namespaces/{ns}/deployments", params)["items"]}
        desired = {manifests.engine_name(t.release, k): spec for k, spec in wanted.items()}
        if not write:
            return {name: Made.of(self._body(spec, have.get(name)), have.get(name)) for name, spec in desired.items()}
        services = {s["metadata"]["name"] for s in self.api.get(f"/api/v1/namespaces/{ns}/services", params)["items"]}
        made = {name: self._ensure(name, spec, have.get(name), name in services) for name, spec in desired.items()}
        for name in sorted(set(have) - set(desired)):
            log.info("engine %s (%s) no longer deployed: deleting it", name,
                     have[name]["metadata"].get("annotations", {}).get(manifests.KEY_ANNOTATION))
            self.api.request("DELETE", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}",
                             {"propagationPolicy": "Background"}, missing_ok=True)
        for name in sorted(services - set(desired)):
            self.api.request("DELETE", f"/api/v1/namespaces/{ns}/services/{name}", missing_ok=True)
        self._reconcile_hpas(desired, params)
        return made

    def _body(self, spec: EngineSpec, current: dict[str, Any] | None) -> dict[str, Any]:
        body = manifests.owned(manifests.deployment(spec, self.template, self.kv_cache_gb), self._owner)
        kept = {k: v for k, v in _annotations(current).items() if k in (WOKEN_ANNOTATION, ASLEEP_ANNOTATION)}
        body["metadata"]["annotations"].update(kept)  # a replacement keeps when it was last woken, or that it sleeps
        if _asleep(current):
            body["spec"]["replicas"] = 0
        return body

    def _ensure(self, name: str, spec: EngineSpec, current: dict[str, Any] | None, has_service: bool) -> Made:
        """The engine's Deployment and Service as they should be."""
        ns = self.api.namespace
        body = self._body(spec, current)
        autoscaled = self.template.autoscaling is not None and not _asleep(current)  # the HPA does nothing at 0
        if current is None:
            if autoscaled:  # the HPA takes the count from here
                body["spec"]["replicas"] = self.template.autoscaling.min_replicas
            log.info("engine %s: creating Deployment %s (%d replicas)", spec.key, name, body["spec"]["replicas"])
            self.api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
        elif _differs(current, body, count=not autoscaled):
            log.info("engine %s: replacing Deployment %s (its pods change, or their number)", spec.key, name)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            if autoscaled:
                body["spec"]["replicas"] = current["spec"].get("replicas", 1)
            self.api.request("PUT", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}", body)
        if not has_service:
            self.api.request("POST", f"/api/v1/namespaces/{ns}/services",
                             manifests.owned(manifests.service(spec, self.template), self._owner))
        return Made.of(body, current)

    # --- scale to zero (idle.py) ------------------------------------------------------------
    def _sleep_idle(self, wanted: dict[str, EngineSpec], views: dict[str, dict[str, Any]],
                    made: dict[str, Made]) -> None:
        """Each engine that may sleep and did no work for its ``scale_to_zero_after_s`` goes to zero."""
        self.idle.retain(set(wanted))
        for key, spec in wanted.items():
            after = spec.options.get("scale_to_zero_after_s")
            name = manifests.engine_name(self.template.release, key)
            if not after or made[name].asleep or views[key].get("waking"):
                continue
            if made[name].woken_at:
                self.idle.active(key, made[name].woken_at)
            self.idle.observe(key, views[key]["replicas"])
            if views[key]["state"] == "ready" and self.idle.idle_s(key) >= float(after):
                log.info("engine %s: idle for %.0f s, scaling it to zero", key, self.idle.idle_s(key))
                at = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
                with self._writes:
                    self._patch(name, {"metadata": {"annotations": {ASLEEP_ANNOTATION: at}}, "spec": {"replicas": 0}})
                self._due = 0.0

    def wake(self, key: str) -> dict[str, Any] | None:
        """Put a sleeping engine's replicas back (a worker holds a request for it); None: no such engine.
        Idempotent: a wake under way, or an engine awake, is answered as it is."""
        with self.lock:
            spec = self.wanted.get(key)
            state = (self._views.get(key) or {}).get("state")
        if spec is None:
            return None
        name = manifests.engine_name(self.template.release, key)
        sent = self._wakes_sent.get(key)
        if state == "scaled_to_zero" and (sent is None or time.monotonic() - sent > WAKE_AGAIN_S):
            self._wakes_sent[key] = time.monotonic()
            replicas = max(spec.replicas, self.template.autoscaling.min_replicas if self.template.autoscaling else 1)
            log.info("engine %s: woken by a request, %d replica(s)", key, replicas)
            with self._writes:
                woken = {ASLEEP_ANNOTATION: None, WOKEN_ANNOTATION: str(self.idle.clock())}
                self._patch(name, {"metadata": {"annotations": woken}, "spec": {"replicas": replicas}})
            with self.lock:
                if key in self._views:
                    self._views[key] = {**self._views[key], "state": "starting", "waking": True}
            self._due = 0.0
            state = "starting"
        return {"engine": key, "state": state}

    def _patch(self, name: str, patch: dict[str, Any]) -> None:
        self.api.request("PATCH", f"/apis/apps/v1/namespaces/{self.api.namespace}/deployments/{name}", patch)

    def _reconcile_hpas(self, desired: dict[str, EngineSpec], params: dict[str, str]) -> None:
        """Each engine's HPA while llmEngines.autoscaling is on; none otherwise (one left from before is deleted)."""
        a, ns = self.template.autoscaling, self.api.namespace
        path = f"/apis/{a.api_version if a else 'autoscaling/v2beta2'}/namespaces/{ns}/horizontalpodautoscalers"
        have = {h["metadata"]["name"]: h for h in self.api.get(path, params)["items"]}
        wanted = {name: manifests.owned(manifests.hpa(spec, self.template), self._owner)
                  for name, spec in desired.items()} if a else {}
        for name, body in wanted.items():
            current = have.get(name)
            if current is None:
                self.api.request("POST", path, body)
            elif _hash(current) != _hash(body):
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                self.api.request("PUT", f"{path}/{name}", body)
        for name in sorted(set(have) - set(wanted)):
            self.api.request("DELETE", f"{path}/{name}", missing_ok=True)

    def _read(self, wanted: dict[str, EngineSpec], made: dict[str, Made]) -> dict[str, dict[str, Any]]:
        """Each engine's view from its pods; ``made``: each one's Deployment now (by name)."""
        ns, t = self.api.namespace, self.template
        params = {"labelSelector": manifests.label_selector(manifests.selector(t.release))}
        pods = self.api.get(f"/api/v1/namespaces/{ns}/pods", params)["items"]
        by_engine: dict[str, list[dict[str, Any]]] = {}
        for pod in pods:
            by_engine.setdefault(pod["metadata"].get("labels", {}).get("serving.io/engine", ""), []).append(pod)
        names = {key: manifests.engine_name(t.release, key) for key in wanted}
        views = {}
        for key, spec in wanted.items():
            pods, m = by_engine.get(names[key], []), made[names[key]]
            view = engine_view(key, pods, t.port, sorted(spec.adapters), m.pod_hash)
            if m.asleep and not view["replicas"]:
                view["state"] = "scaled_to_zero"
            elif self.cold_starts.waking(key, m.woken_at, pods):
                view["waking"] = True
            if spec.options.get("scale_to_zero_after_s"):
                view["scale_to_zero_after_s"] = spec.options["scale_to_zero_after_s"]
            if key in self.cold_starts.last:
                view["cold_start_s"] = round(self.cold_starts.last[key], 1)
            views[key] = view
        return views

    # --- what others read ---------------------------------------------------------------
    def view(self) -> dict[str, Any]:
        """The last map read. While the API fails, engines already read keep their entries (their pods do not
        depend on the API to serve); an engine never read yet is ``failed`` with the API's error."""
        with self.lock:
            views = {k: v for k, v in self._views.items() if k in self.wanted}
            if self._api_error:
                views |= {k: _failed(k, self._api_error) for k in self.wanted if k not in views}
            return {"engines": views}

    def readiness(self) -> dict[str, Any]:
        """Engines that cannot serve, with why; and each engine's state for the console (registry/readiness.py)."""
        views = self.view()["engines"]
        with self.lock:
            failures = {k: v["error"] or "failed" for k, v in views.items() if v["state"] == "failed"}
            return {"revision": self.revision, "failures": failures, "engines": engine_states(views)}

    def close(self) -> None:
        """Nothing to stop: the engines are the cluster's, and a restarted control plane adopts them."""


def _annotations(obj: dict[str, Any] | None) -> dict[str, str]:
    return ((obj or {}).get("metadata") or {}).get("annotations") or {}


def _hash(body: dict[str, Any]) -> str | None:
    return _annotations(body).get(manifests.HASH_ANNOTATION)


def _asleep(current: dict[str, Any] | None) -> bool:
    """Scaled to zero, and no wake since (a wake removes the annotation)."""
    return ASLEEP_ANNOTATION in _annotations(current)


def _differs(current: dict[str, Any], body: dict[str, Any], count: bool = True) -> bool:
    """Its pods should run something else, or (``count``: no HPA owns it) their number changed."""
    return _hash(current) != _hash(body) or (count and current["spec"].get("replicas") != body["spec"]["replicas"])


def _woken_at(current: dict[str, Any] | None) -> float | None:
    try:
        return float(_annotations(current)[WOKEN_ANNOTATION])
    except (KeyError, ValueError):
        return None


def _failed(key: str, error: str) -> dict[str, Any]:
    return {"url": None, "served_model_name": key, "state": "failed", "error": error, "replicas": []}


def engine_view(key: str, pods: list[dict[str, Any]], port: int, adapters: list[str],
                current: str | None = None) -> dict[str, Any]:
    """``GET /engines``'s entry for an engine from its pods (terminating ones left out), shaped as the
    one-machine launcher's (launch/launcher.py ``EngineSet.view``). ``current``: the pod template's hash now;
    during a rolling update only pods of that template hold ``adapters`` (older ones serve the base)."""
    replicas = [pod_view(p, port, adapters if current is None or _hash(p) == current else [])
                for p in sorted(pods, key=lambda p: p["metadata"]["name"])
                if not p["metadata"].get("deletionTimestamp")]
    states = {r["state"] for r in replicas}
    state = "ready" if "ready" in states else "starting" if "starting" in states or not replicas else "failed"
    first = next((r for r in replicas if r["state"] == "ready"), None)
    error = next((f"pod {r['id']}: {r['error']}" for r in replicas if r["error"]), None) if state != "ready" else None
    return {"url": first["url"] if first else None, "served_model_name": key, "state": state, "error": error,
            "replicas": replicas}


def pod_view(pod: dict[str, Any], port: int, adapters: list[str]) -> dict[str, Any]:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    error = None if ready else _stuck(status)
    ip = status.get("podIP")
    return {"id": pod["metadata"]["name"], "url": f"http://{ip}:{port}/v1" if ip else None,
            "state": "ready" if ready and ip else "failed" if error else "starting", "error": error,
            "adapters": list(adapters) if ready else []}


def _stuck(status: dict[str, Any]) -> str | None:
    """Why a pod will not become ready by itself, in kubelet's words, or None while it may still."""
    for c in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            last = (c.get("lastState") or {}).get("terminated") or {}
            said = (last.get("message") or "").strip().splitlines()
            detail = said[-1] if said else waiting.get("message") or last.get("reason") or ""
            return f"{c['name']}: {waiting['reason']}" + (f": {detail[:300]}" if detail else "")
    return None

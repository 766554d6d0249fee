"""The launcher on Kubernetes when the API fails (serving/llm/kube/engines.py): the engines' pods serve without
the API, so the workers keep the last map read, and only an engine never read yet is failed with the API's error.

The API here is a stand-in object with the client's three calls: the real API server is used by the cluster
test (tests/deploy/kube/test_llm_engines.py), where making it fail on cue is not possible."""
from __future__ import annotations

from serving.kube_api import KubeError
from serving.llm.kube import manifests
from serving.llm.kube.engines import KubeEngines
from serving.llm.kube.template import EngineTemplate

TEMPLATE = EngineTemplate.model_validate({"release": "demo-serving", "image": "vllm:1", "initImage": "serving:1",
                                          "controlPlaneUrl": "http://cp:8080"})


def snapshot(*models: str) -> dict:
    return {"revision": 1, "endpoints": {m: {"engine": "vllm", "engine_options": {},
                                             "targets": [{"model": m, "version": 1, "artifact": "a" * 64}]}
                                         for m in models}}


class StandInAPI:
    namespace = "ml"

    def __init__(self) -> None:
        self.deployments: dict[str, dict] = {}
        self.services: set[str] = set()
        self.failing = False

    def get(self, path: str, params: dict | None = None) -> dict:
        if self.failing:
            raise KubeError(f"GET {path}: 503 the API server is restarting")
        if path.endswith("/deployments"):
            return {"items": list(self.deployments.values())}
        if path.endswith("/services"):
            return {"items": [{"metadata": {"name": n}} for n in self.services]}
        if path.endswith("/pods"):  # every engine has one ready pod
            return {"items": [{"metadata": {"name": f"{n}-0", "labels": {"serving.io/engine": n}},
                               "status": {"podIP": "10.0.0.9", "conditions": [{"type": "Ready", "status": "True"}]}}
                              for n in self.deployments]}
        return {"items": []}

    def request(self, method: str, path: str, body: dict | None = None, params=None, missing_ok=False) -> dict:
        if self.failing:
            raise KubeError(f"{method} {path}: 503")
        if method == "POST" and body["kind"] == "Deployment":
            self.deployments[body["metadata"]["name"]] = body
        elif method == "POST" and body["kind"] == "Service":
            self.services.add(body["metadata"]["name"])
        return {}


def tick(launcher: KubeEngines) -> None:
    launcher._due = 0.0
    launcher.tick()


def test_a_failing_api_keeps_the_last_map_and_fails_only_what_was_never_read():
    api, changes = StandInAPI(), []
    launcher = KubeEngines(api, TEMPLATE, on_change=lambda: changes.append(1))
    launcher.apply(snapshot("chat"))
    tick(launcher)
    assert manifests.engine_name("demo-serving", "chat:1") in api.deployments
    assert launcher.view()["engines"]["chat:1"]["state"] == "ready"
    api.failing = True
    launcher.apply(snapshot("chat", "other"))
    tick(launcher)
    view = launcher.view()["engines"]
    assert view["chat:1"]["state"] == "ready" and view["chat:1"]["url"] == "http://10.0.0.9:8000/v1"
    assert view["other:1"]["state"] == "failed" and "the Kubernetes API" in view["other:1"]["error"]
    assert launcher.readiness()["failures"] == {"other:1": view["other:1"]["error"]}
    api.failing = False
    tick(launcher)
    assert {k: v["state"] for k, v in launcher.view()["engines"].items()} == {"chat:1": "ready", "other:1": "ready"}
    assert changes, "each change of the map was reported"

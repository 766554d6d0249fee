"""What GET /engines says of an engine from its pods (serving/llm/kube/engines.py), in kubelet's own shapes."""
from __future__ import annotations

from serving.llm.kube.engines import engine_view


def pod(name: str, ip: str | None = "10.0.0.5", ready: bool = False, **status) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    return {"metadata": {"name": name}, "status": {"podIP": ip, "conditions": conditions, **status}}


CRASHING = {"containerStatuses": [{"name": "vllm", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 1, "message":
                                                 "loading\nValueError: max_model_len 9999 > 512"}}}]}
NO_IMAGE = {"initContainerStatuses": [{"name": "model", "state": {"waiting": {
    "reason": "ImagePullBackOff", "message": "Back-off pulling image \"serving:nope\""}}}]}


def test_a_ready_pod_serves_and_others_wait():
    view = engine_view("m:1", [pod("b", ready=False), pod("a", ip="10.0.0.9", ready=True)], 8000, ["lora:1"])
    assert view["state"] == "ready" and view["url"] == "http://10.0.0.9:8000/v1" and view["error"] is None
    assert [(r["id"], r["state"], r["adapters"]) for r in view["replicas"]] == \
        [("a", "ready", ["lora:1"]), ("b", "starting", [])]


def test_stuck_pods_fail_the_engine_with_kubelets_reason():
    view = engine_view("m:1", [pod("a", **CRASHING)], 8000, [])
    assert view["state"] == "failed"
    assert view["error"] == "pod a: vllm: CrashLoopBackOff: ValueError: max_model_len 9999 > 512"
    view = engine_view("m:1", [pod("a", ip=None, **NO_IMAGE)], 8000, [])
    assert view["state"] == "failed" and "ImagePullBackOff" in view["error"] and "serving:nope" in view["error"]


def test_no_pod_yet_is_starting_and_a_terminating_one_is_left_out():
    assert engine_view("m:1", [], 8000, [])["state"] == "starting"
    leaving = pod("old", ready=True)
    leaving["metadata"]["deletionTimestamp"] = "2026-11-28T08:00:00Z"
    view = engine_view("m:1", [leaving, pod("new")], 8000, [])
    assert view["state"] == "starting" and [r["id"] for r in view["replicas"]] == ["new"]


def test_one_ready_pod_among_crashing_ones_serves():
    view = engine_view("m:1", [pod("a", **CRASHING), pod("b", ready=True)], 8000, [])
    assert view["state"] == "ready" and view["error"] is None
    assert [r["state"] for r in view["replicas"]] == ["failed", "ready"]


def test_during_a_rolling_update_only_the_new_template_holds_the_adapters():
    """An adapter joins its base's engine by a new pod template (--lora-modules): until the old pods are gone
    they serve the base only, so the workers must not send them the adapter's requests."""
    old, new = pod("a", ready=True), pod("b", ready=True)
    old["metadata"]["annotations"] = {"serving.io/pod-template-hash": "h1"}
    new["metadata"]["annotations"] = {"serving.io/pod-template-hash": "h2"}
    view = engine_view("m:1", [old, new], 8000, ["lora:1"], current="h2")
    assert [(r["id"], r["adapters"]) for r in view["replicas"]] == [("a", []), ("b", ["lora:1"])]

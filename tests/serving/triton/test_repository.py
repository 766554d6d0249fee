"""External Triton model repository: schema-valid config.pbtxt, right directories, explicit load/unload."""
from __future__ import annotations

import os
import time

import pytest
from fastapi import FastAPI, HTTPException
from tritonclient.grpc import model_config_pb2 as mc

from serving.testmodels import make_signature
from serving.triton import triton_model_name
from serving.triton.repository import (
    MARKER, ConfigError, RepositorySync, TritonTarget, config_pbtxt, triton_targets, validate_config_pbtxt,
)
from tests.serving.triton.fake_control_plane import serve_app, target, triton_endpoint
from tests.support.procs import wait_until

BATCHING = {"max_batch_size": 16, "max_queue_delay_us": 2000, "preferred_batch_sizes": [4, 8, 64], "instances": 2}


def test_naming_contract():
    assert triton_model_name("sentiment", 3) == "sentiment_v3"


def test_config_pbtxt_matches_triton_schema():
    text = config_pbtxt(TritonTarget("sentiment_v1", "sha", make_signature(2), BATCHING))
    cfg = validate_config_pbtxt(text)
    assert (cfg.name, cfg.backend, cfg.platform) == ("sentiment_v1", "onnxruntime", "onnxruntime_onnx")
    assert cfg.max_batch_size == 16
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 2000
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]  # 64 > max_batch_size dropped
    assert [(g.count, g.kind) for g in cfg.instance_group] == [(2, mc.ModelInstanceGroup.KIND_AUTO)]
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [
        (n, mc.TYPE_INT64, [-1]) for n in ("input_ids", "attention_mask", "token_type_ids")]  # batch dim stripped
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("logits", mc.TYPE_FP32, [2])]


@pytest.mark.parametrize("broken", [
    'name: "m" backend: "onnxruntime" max_batch_sise: 4',                      # unknown field
    'name: "m" backend: "onnxruntime" input { name: "x" data_type: TYPE_INT65 dims: 1 }',  # bad enum
    'name: "m" backend: "onnxruntime" input { name: "x" data_type: TYPE_INT64 }',  # no dims
    'backend: "onnxruntime"',                                                   # no name
    'name: "m" backend: "onnxruntime" max_batch_size: 2 dynamic_batching { preferred_batch_size: 4 }',
    'name: "m" backend: "onnxruntime" {',                                       # not even text proto
])
def test_broken_config_rejected(broken):
    with pytest.raises(ConfigError):
        validate_config_pbtxt(broken)


def snapshot(*endpoints):
    return {"revision": 1, "endpoints": {ep["name"]: ep for ep in endpoints}}


@pytest.fixture
def artifacts(tmp_path):
    """Two fake ONNX artifacts addressed by name (content is irrelevant to the writer)."""
    store = tmp_path / "store"
    store.mkdir()
    for sha in ("a" * 64, "b" * 64):
        (store / sha).write_bytes(sha.encode())
    return store


def test_sync_writes_and_removes_model_dirs(tmp_path, artifacts):
    repo = tmp_path / "repo"
    (repo / "hand_made").mkdir(parents=True)  # a model someone else put there: never touched
    sig = make_signature(2)
    onnx_ep = {**triton_endpoint("local", [target("other", 1, "a" * 64, sig)]), "engine": "onnxruntime"}
    sync = RepositorySync(repo, lambda sha: artifacts / sha, control_url=None)

    sync.apply(snapshot(triton_endpoint("clf", [target("clf", 1, "a" * 64, sig), target("clf", 2, "b" * 64, sig)]),
                        onnx_ep))
    assert sorted(p.name for p in repo.iterdir()) == ["clf_v1", "clf_v2", "hand_made"]
    for name, sha in (("clf_v1", "a" * 64), ("clf_v2", "b" * 64)):
        model = repo / name / "1" / "model.onnx"
        assert model.read_bytes() == sha.encode()
        assert os.path.samefile(model, artifacts / sha)  # hardlinked, not copied
        assert validate_config_pbtxt((repo / name / "config.pbtxt").read_text()).name == name
        assert (repo / name / MARKER).exists()

    sync.apply(snapshot(triton_endpoint("clf", [target("clf", 2, "b" * 64, sig)])))
    assert sorted(p.name for p in repo.iterdir()) == ["clf_v2", "hand_made"]


def test_targets_shared_by_endpoints_are_one_model():
    sig = make_signature(2)
    found = triton_targets(snapshot(triton_endpoint("b", [target("m", 1, "a" * 64, sig)], max_batch_size=4),
                                    triton_endpoint("a", [target("m", 1, "a" * 64, sig)], max_batch_size=2)))
    assert list(found) == ["m_v1"] and found["m_v1"].batching["max_batch_size"] == 2  # first endpoint by name


def test_sync_drives_triton_explicit_model_control(tmp_path, artifacts):
    """A stand-in for Triton's HTTP repository API records what the writer asks it to do."""
    calls: list[tuple[str, str, str | None]] = []
    app = FastAPI()

    @app.get("/v2/health/ready")
    def ready():
        return {}

    @app.post("/v2/repository/models/{name}/{action}")
    def control(name: str, action: str):
        return {}

    @app.middleware("http")
    async def record(request, call_next):
        parts = request.url.path.split("/")
        if request.method == "POST":
            calls.append((parts[-1], parts[-2], request.headers.get("triton-access-token")))
        return await call_next(request)

    sig = make_signature(2)
    v1, v2 = target("clf", 1, "a" * 64, sig), target("clf", 2, "b" * 64, sig)
    with serve_app(app, "/v2/health/ready") as url:
        sync = RepositorySync(tmp_path / "repo", lambda sha: artifacts / sha, url,
                              headers={"triton-access-token": "t"})
        sync.apply(snapshot(triton_endpoint("clf", [v1])))
        assert calls == [("load", "clf_v1", "t")]  # first snapshot: load what we want
        calls.clear()
        sync.apply(snapshot(triton_endpoint("clf", [v1, v2])))
        assert calls == [("load", "clf_v2", "t")]  # unchanged clf_v1 is not reloaded
        calls.clear()
        sync.apply(snapshot(triton_endpoint("clf", [v2])))
        assert calls == [("unload", "clf_v1", "t")]


def test_load_that_failed_while_triton_was_down_is_retried(tmp_path, artifacts):
    """The stand-in answers 503 to the first load, as Triton does while starting; the writer retries."""
    calls: list[str] = []
    app = FastAPI()

    @app.get("/v2/health/ready")
    def ready():
        return {}

    @app.post("/v2/repository/models/{name}/load")
    def load(name: str):
        calls.append(name)
        if len(calls) == 1:
            raise HTTPException(503, "starting")
        return {}

    sig = make_signature(2)
    with serve_app(app, "/v2/health/ready") as url:
        sync = RepositorySync(tmp_path / "repo", lambda sha: artifacts / sha, url, retry_period_s=0.2)
        sync.apply(snapshot(triton_endpoint("clf", [target("clf", 1, "a" * 64, sig)])))
        wait_until(lambda: len(calls) >= 2, 5, "the failed load to be retried")
        time.sleep(0.6)
        assert calls == ["clf_v1", "clf_v1"]  # retried once it failed, then never again
    assert (tmp_path / "repo" / "clf_v1" / "config.pbtxt").stat().st_mode & 0o777 == 0o644


def test_model_an_external_triton_lost_is_loaded_again(tmp_path, artifacts):
    """A stand-in whose index stops listing clf_v1 as READY (Triton restarted in explicit mode, or the
    model unloaded through its API): the writer loads it again, and leaves ready models alone."""
    state = {"clf_v1": "READY", "clf_v2": "READY"}
    loads: list[str] = []
    app = FastAPI()

    @app.get("/v2/health/ready")
    def ready():
        return {}

    @app.post("/v2/repository/index")
    def index():
        return [{"name": n, "version": "1", "state": s} for n, s in state.items()]

    @app.post("/v2/repository/models/{name}/load")
    def load(name: str):
        loads.append(name)
        state[name] = "READY"
        return {}

    sig = make_signature(2)
    with serve_app(app, "/v2/health/ready") as url:
        sync = RepositorySync(tmp_path / "repo", lambda sha: artifacts / sha, url, retry_period_s=0.2)
        sync.apply(snapshot(triton_endpoint("clf", [target("clf", 1, "a" * 64, sig), target("clf", 2, "b" * 64, sig)])))
        assert sorted(loads) == ["clf_v1", "clf_v2"]
        time.sleep(0.6)
        assert len(loads) == 2  # ready models are not reloaded
        state["clf_v1"] = "UNAVAILABLE"
        wait_until(lambda: len(loads) == 3, 5, "the lost model to be loaded again")
        assert loads[-1] == "clf_v1" and state["clf_v1"] == "READY"
        time.sleep(0.6)
        assert len(loads) == 3

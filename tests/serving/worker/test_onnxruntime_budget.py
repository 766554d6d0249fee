"""The in-worker onnxruntime engine under a memory budget (SERVING_WORKER_MEMORY_BUDGET_MB), in-process.

Real onnxruntime sessions of six real ONNX models built here: ``y = x @ W``, each W a distinct 8 MB
float32 initializer, so that a session's cost is measurable in the process's RSS (about 8 MB each).
The budget holds two of them, never three. Every answer is compared with onnxruntime run directly
on the same input. What is held is watched independently of the engine's own accounting: every
session the engine opens is tracked with ``weakref.finalize``, so "open" means "not yet freed".
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from serving.settings import WorkerSettings
from serving.worker.engines import onnxruntime as ort_engine
from serving.worker.engines import onnxruntime_budget
from serving.worker.engines.onnxruntime_budget import BudgetedSessions
from serving.worker.engines.onnxruntime_sessions import Sessions
from serving.worker.engines.session_budget import IDLE_S, MB, SessionBudget
from serving.worker.errors import ServingError, Unavailable
from serving.worker.runtime import Target

MODELS = 6
ROWS, COLS = 1024, 2048  # W: 8 MB of float32
BUDGET = 20 * MB         # two 8 MB sessions, never three
INPUTS_PER_MODEL = 3


def build_matmul(path: Path, seed: int) -> None:
    w = np.random.default_rng(seed).standard_normal((ROWS, COLS), dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], f"matmul{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, ROWS])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, COLS])], [numpy_helper.from_array(w, "w")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)


class Models:
    """Six models on disk, inputs for each, and onnxruntime's own answers to them."""

    def __init__(self, root: Path) -> None:
        import onnxruntime

        self.root = root
        self.inputs: dict[str, list[np.ndarray]] = {}
        self.expected: dict[str, list[np.ndarray]] = {}
        for i in range(MODELS):
            name = f"m{i}"
            build_matmul(root / f"{name}.onnx", seed=i)
            rng = np.random.default_rng(100 + i)
            self.inputs[name] = [rng.standard_normal((1, ROWS), dtype=np.float32) for _ in range(INPUTS_PER_MODEL)]
            direct = onnxruntime.InferenceSession(str(root / f"{name}.onnx"), providers=["CPUExecutionProvider"])
            self.expected[name] = [direct.run(["y"], {"x": x})[0] for x in self.inputs[name]]
            del direct

    def path(self, artifact: str) -> Path:
        return self.root / f"{artifact}.onnx"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Models:
    return Models(tmp_path_factory.mktemp("budget-models"))


def target(name: str) -> Target:
    return Target(model=name, version=1, weight=100.0, triton_name="", artifact=name, inputs=(), outputs=())


class Watched:
    """Counts the sessions the engine opens and the most alive at once (freed ones finalized)."""

    def __init__(self, engine: ort_engine.OnnxRuntimeEngine) -> None:
        self.opened = 0
        self.alive = 0
        self.most = 0
        self.watching = False
        self._lock = threading.Lock()
        load = engine.sessions._load

        def counted(artifact: str):
            session = load(artifact)
            with self._lock:
                self.opened += 1
                self.alive += 1
                if self.watching:
                    self.most = max(self.most, self.alive)
            weakref.finalize(session, self._freed)
            return session

        engine.sessions._load = counted

    def _freed(self) -> None:
        with self._lock:
            self.alive -= 1

    def watch(self) -> None:
        with self._lock:
            self.watching, self.most = True, self.alive


def engine_with(models: Models, budget: int = BUDGET, wait_s: float = 10.0,
                parallel: int = 2) -> tuple[ort_engine.OnnxRuntimeEngine, Watched]:
    engine = ort_engine.OnnxRuntimeEngine(BudgetedSessions(models.path, budget, threads=1, wait_s=wait_s), parallel)
    return engine, Watched(engine)


@pytest.fixture
def exact_costs(monkeypatch):
    """Every session costs its file's size (RSS reads as constant): for tests of which session goes,
    where one noisy process-wide measure must not change the answer."""
    monkeypatch.setattr(onnxruntime_budget, "resident_bytes", lambda: 0)


async def ask(engine, models: Models, name: str, k: int) -> None:
    """One request, its answer checked against onnxruntime's."""
    out = await engine.infer(target(name), {"x": models.inputs[name][k]})
    np.testing.assert_allclose(out["y"], models.expected[name][k], rtol=1e-5, atol=1e-4)


def test_a_walk_and_concurrent_clients_over_six_models_get_only_right_answers_within_two(models):
    engine, watched = engine_with(models)
    held: list[int] = []
    stop = threading.Event()

    def sample() -> None:  # the engine's own view, sampled throughout
        while not stop.is_set():
            held.append(engine.memory()["sessions"])
            time.sleep(0.002)

    async def client(c: int) -> None:
        for step in range(2 * MODELS):
            await ask(engine, models, f"m{(c + step) % MODELS}", (c + step) % INPUTS_PER_MODEL)

    async def run() -> None:
        for rounds in range(2):  # a walk: every model in turn, the budget holding two
            for i in range(MODELS):
                await ask(engine, models, f"m{i}", rounds % INPUTS_PER_MODEL)
        await asyncio.gather(*(client(c) for c in range(MODELS)))

    for i in range(MODELS):
        engine.prepare(target(f"m{i}"))
    assert all(engine.is_ready(target(f"m{i}")) for i in range(MODELS))  # cold ones too: loadable
    assert watched.alive <= 2 and engine.memory()["sessions"] <= 2
    watched.watch()
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        asyncio.run(run())
    finally:
        stop.set()
        sampler.join()
        asyncio.run(engine.close())
    assert watched.most <= 2, f"{watched.most} sessions alive at once"
    assert max(held) <= 2
    assert watched.opened > MODELS  # models were closed and opened again: the budget did work
    costs = [m.per_instance for m in engine.sessions.budget.models.values()]
    assert all(8 * MB <= c < 24 * MB for c in costs), [c / MB for c in costs]  # measured: about 8.05 MB


def test_the_least_recently_used_idle_session_is_the_one_closed(models, caplog, exact_costs):
    engine, _ = engine_with(models)

    async def run() -> None:
        await ask(engine, models, "m0", 0)
        await ask(engine, models, "m1", 0)
        await ask(engine, models, "m0", 1)  # m1 is now the least recently used
        await asyncio.sleep(IDLE_S + 0.05)
        await ask(engine, models, "m2", 0)

    for i in range(3):
        engine.prepare(target(f"m{i}"))
    assert set(engine.sessions._sessions) == {"m0", "m1"}  # what fitted at admission stays open
    with caplog.at_level(logging.INFO, logger="serving.worker.engines.onnxruntime_budget"):
        asyncio.run(run())
    asyncio.run(engine.close())
    closes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("closed ")]
    assert closes == ["closed m1:1 (8.0 MB) to make room for m2:1"]
    assert set(engine.sessions._sessions) == {"m0", "m2"}
    assert any("loaded m2:1 on demand" in r.getMessage() for r in caplog.records)


def test_a_corrupt_or_missing_artifact_still_fails_readiness_under_a_budget(models, tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"not an onnx model" * 1000)
    good = models.path("m0")
    engine = ort_engine.OnnxRuntimeEngine(BudgetedSessions(lambda a: tmp_path / f"{a}.onnx" if a != "m0" else good,
                                                           BUDGET))
    for name in ("bad", "missing"):
        with pytest.raises(Exception):
            engine.prepare(target(name))
        assert not engine.is_ready(target(name))
        with pytest.raises(ServingError) as refused:  # a request for it is a 503, never a 500
            asyncio.run(engine.infer(target(name), {"x": models.inputs["m0"][0]}))
        assert refused.value.status == 503
    engine.prepare(target("m0"))
    assert engine.is_ready(target("m0"))
    asyncio.run(ask(engine, models, "m0", 0))
    asyncio.run(engine.close())


def test_without_a_budget_every_session_opens_at_prepare(models, tmp_path):
    plain = ort_engine.create(WorkerSettings(home=tmp_path, ort_parallel=2), models.path)
    assert type(plain.sessions) is Sessions
    budgeted = ort_engine.create(WorkerSettings(home=tmp_path, worker_memory_budget_mb=20), models.path)
    assert isinstance(budgeted.sessions, BudgetedSessions) and budgeted.sessions.budget.limit == BUDGET
    asyncio.run(budgeted.close())
    watched = Watched(plain)
    for i in range(MODELS):
        plain.prepare(target(f"m{i}"))
    assert watched.opened == MODELS and set(plain.sessions._sessions) == {f"m{i}" for i in range(MODELS)}

    async def run() -> None:
        await asyncio.gather(*(ask(plain, models, f"m{i}", i % INPUTS_PER_MODEL) for i in range(MODELS)))

    asyncio.run(run())
    assert watched.opened == MODELS  # no request opened anything
    asyncio.run(plain.close())


def test_concurrent_first_requests_for_a_cold_model_load_it_once(models, exact_costs):
    engine, watched = engine_with(models)
    for i in range(3):
        engine.prepare(target(f"m{i}"))
    assert "m2" not in engine.sessions._sessions and watched.opened == 3  # checked once at admission, then closed

    async def run() -> None:
        await asyncio.gather(*(ask(engine, models, "m2", k % INPUTS_PER_MODEL) for k in range(8)))

    asyncio.run(run())
    asyncio.run(engine.close())
    assert watched.opened == 4, "eight concurrent first requests, one load"


def test_busy_sessions_holding_the_budget_make_a_cold_request_wait_then_503(models, exact_costs):
    engine, _ = engine_with(models, budget=10 * MB, wait_s=0.3)  # room for one session
    engine.prepare(target("m0"))
    engine.prepare(target("m1"))
    assert set(engine.sessions._sessions) == {"m0"}
    assert engine.sessions.take("m0") is not None  # an inference under way on m0, until released
    t0 = time.monotonic()
    with pytest.raises(Unavailable) as refused:
        asyncio.run(engine.infer(target("m1"), {"x": models.inputs["m1"][0]}))
    assert time.monotonic() - t0 >= 0.3 and refused.value.headers["Retry-After"] == "1"
    engine.sessions.release("m0")
    engine.sessions.wait_s = 5.0

    async def waits_for_the_busy_one() -> None:  # busy only briefly: the cold request waits, then runs
        engine.sessions.take("m0")
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, engine.sessions.release, "m0")
        await ask(engine, models, "m1", 0)

    asyncio.run(waits_for_the_busy_one())
    assert set(engine.sessions._sessions) == {"m1"}
    asyncio.run(engine.close())


def test_a_model_larger_than_the_budget_loads_alone_with_a_warning(models, caplog):
    engine, watched = engine_with(models, budget=4 * MB)
    engine.prepare(target("m0"))
    engine.prepare(target("m1"))
    assert not engine.sessions._sessions and engine.is_ready(target("m0"))  # neither fits: both cold

    async def run() -> None:
        await ask(engine, models, "m0", 0)
        await asyncio.sleep(IDLE_S + 0.05)
        await ask(engine, models, "m1", 0)

    watched.watch()
    with caplog.at_level(logging.WARNING, logger="serving.worker.engines.onnxruntime_budget"):
        asyncio.run(run())
    asyncio.run(engine.close())
    assert set(engine.sessions._sessions) == {"m1"} and watched.most == 1
    assert any("more than the worker's whole memory budget" in r.getMessage() for r in caplog.records)


# --- the policy alone --------------------------------------------------------------------------

def test_policy_costs_start_at_the_file_size_and_follow_measures():
    budget = SessionBudget(100)
    budget.admit("a", 30)
    assert budget.cost("a") == 30  # nothing measured: the file's size
    budget.opened("a", 45, now=1.0)
    assert budget.cost("a") == 45 and budget.held() == (1, 45)
    budget.ran_first("a", 5)
    assert budget.held() == (1, 50)  # what its first run added counts too
    budget.closed("a")
    assert budget.held() == (0, 0) and budget.cost("a") == 50


def test_policy_admission_keeps_open_what_fits_and_the_rest_goes_cold():
    budget = SessionBudget(100)
    for name in "abc":
        budget.admit(name, 40)
    assert budget.admitted("a", 40) and budget.admitted("b", 45)
    assert not budget.admitted("c", 40)  # 125 of 100: closed again, loadable on its first request
    assert budget.held() == (2, 85) and budget.loadable("c") and budget.models["c"].state == "cold"


def test_policy_one_odd_measure_does_not_stick_and_none_is_below_the_file():
    budget = SessionBudget(100)
    budget.admit("b", 30)
    for measured, cost in ((40, 40), (80, 80), (40, 40), (10, 40), (10, 30)):
        budget.opened("b", measured, now=1.0)
        assert budget.cost("b") == cost, (measured, budget.measures["b"])
        budget.closed("b")


def test_policy_never_closes_a_session_in_use_and_reserves_room_while_one_opens():
    budget = SessionBudget(100, idle_s=0.25)
    for name in ("a", "b"):
        budget.admit(name, 40)
        budget.opened(name, 40, now=0.0)
    budget.admit("c", 40)
    budget.begin("a", now=10.0)
    budget.end("a", now=10.0)
    assert budget.room_for("c", now=11.0) == ["b"]  # b used longest ago
    budget.begin("b", now=11.0)  # now running on b, a idle
    assert budget.room_for("c", now=11.0) == ["a"]
    budget.begin("a", now=11.0)
    assert budget.room_for("c", now=11.0) is None  # both running: wait
    budget.end("a", now=11.0)
    assert budget.room_for("c", now=11.1) is None  # a used 0.1 s ago: still within its guard
    assert budget.room_for("c", now=11.3) == ["a"]
    budget.closed("a")
    budget.reserve("c")
    budget.admit("d", 40)
    assert not budget.fits("d")  # c's room is taken while it opens
    budget.end("b", now=12.0)
    budget.opened("c", 70, now=12.0)  # measured above its 40 MB estimate: past the budget
    assert budget.refit("c", now=12.1) == []  # b used 0.1 s ago: kept for now
    assert budget.refit("c", now=12.5) == ["b"]


# --- through a worker: config apply, readiness gate, the v2 protocol -----------------------------

def matmul_spec(name: str, versions: dict[int, str]) -> dict:
    """An endpoint over MatMul models (``version -> artifact``), tensors in and out as they are."""
    signature = {"inputs": [{"name": "x", "dtype": "FP32", "shape": [-1, ROWS]}],
                 "outputs": [{"name": "y", "dtype": "FP32", "shape": [-1, COLS]}]}
    targets = [{"model": name, "version": v, "weight": 100.0 if i == 0 else 0.0, "role": "stable",
                "triton_name": f"{name}_v{v}", "artifact": sha, "framework": "onnx", "signature": signature}
               for i, (v, sha) in enumerate(versions.items())]
    return {"name": name, "engine": "onnxruntime", "preprocess": {"kind": "none"}, "targets": targets,
            "metrics": [], "log_freq": 1.0, "batching": {"max_batch_size": 0, "max_queue_delay_us": 0,
                                                          "preferred_batch_sizes": [], "instances": 1}}


def v2_answer(client, endpoint: str, x: np.ndarray) -> tuple[int, np.ndarray | None, str]:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    r = client.post(f"/v2/models/{endpoint}/infer", json=body)
    if r.status_code != 200:
        return r.status_code, None, r.text
    out = r.json()["outputs"][0]
    return 200, np.asarray(out["data"], dtype=np.float32).reshape(out["shape"]), r.headers["X-Model-Version"]


def test_a_worker_with_a_budget_serves_cold_models_and_keeps_old_routes_for_a_corrupt_version(
        models, make_client, store, tmp_path):
    from tests.serving.worker.support import snapshot

    shas = {f"m{i}": store.put_file(models.path(f"m{i}"))[0] for i in range(3)}
    specs = [matmul_spec(f"e{i}", {1: shas[f"m{i}"]}) for i in range(3)]
    client, _ = make_client(*specs, worker_memory_budget_mb=10)  # one session at a time
    engine = client.app.state.dataplane.config.engines["onnxruntime"]
    assert isinstance(engine.sessions, BudgetedSessions)
    for rounds in range(2):
        for i in range(3):
            status, y, version = v2_answer(client, f"e{i}", models.inputs[f"m{i}"][rounds])
            assert status == 200, version
            np.testing.assert_allclose(y, models.expected[f"m{i}"][rounds], rtol=1e-5, atol=1e-4)
            assert engine.memory()["sessions"] <= 1
    (tmp_path / "corrupt.onnx").write_bytes(b"\x08\x07garbage" * 4096)
    bad = store.put_file(tmp_path / "corrupt.onnx")[0]
    sync = client.app.state.dataplane.config
    sync.apply(snapshot(matmul_spec("e0", {2: bad}), *specs[1:], revision=2))
    assert "e0" in client.get("/status").json()["errors"]
    status, y, version = v2_answer(client, "e0", models.inputs["m0"][0])  # version 1 still answers
    assert status == 200 and version == "1"
    np.testing.assert_allclose(y, models.expected["m0"][0], rtol=1e-5, atol=1e-4)

"""Many small Triton endpoints under a memory budget, on real processes.

Shared by tests/serving/triton/test_budget.py (6 models, a budget that fits 2) and
benchmarks/many_models.py (100 models): distinct model variants, their deployment through the
control plane's API, the v2 request and its direct onnxruntime answer, and a watcher that samples
what Triton really holds (its repository index, and its stub processes' resident memory read with
psutil, independently of the loader's own accounting).
"""
from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import psutil

from serving.triton.loader import stub_memory
from tests.serving.stack import Stack

HELD = {"READY", "LOADING", "UNLOADING"}  # index states that hold memory


def variants(base_onnx: Path, n: int, out_dir: Path) -> list[Path]:
    """``n`` copies of a classifier, each with its own ``classifier.bias``: every endpoint answers
    differently, so a request answered by the wrong model cannot pass as right."""
    import onnx
    from onnx import numpy_helper

    out_dir.mkdir(parents=True, exist_ok=True)
    model = onnx.load(str(base_onnx))
    bias = next(i for i in model.graph.initializer if i.name == "classifier.bias")
    original = numpy_helper.to_array(bias).copy()
    paths = []
    for k in range(n):
        shifted = (original + np.array([0.37 * k, -0.21 * k], dtype=original.dtype)).astype(original.dtype)
        bias.CopyFrom(numpy_helper.from_array(shifted, "classifier.bias"))
        path = out_dir / f"variant{k}.onnx"
        onnx.save(model, str(path))
        paths.append(path)
    return paths


def deploy(stack: Stack, paths: list[Path], prefix: str = "m") -> list[str]:
    """Upload each file as model ``{prefix}{k}`` and put it behind endpoint ``{prefix}{k}`` (Triton
    engine, no preprocessing); returns the endpoint names."""
    names = []
    with stack.api(timeout=120) as api:
        for k, path in enumerate(paths):
            name = f"{prefix}{k}"
            r = api.post("/artifacts", content=path.read_bytes())
            assert r.status_code == 201, r.text
            r = api.post("/models", json={"name": name, "artifact": r.json()["sha256"], "framework": "onnx"})
            assert r.status_code == 201, r.text
            r = api.post("/endpoints", json={"endpoint": name, "model": name, "version": 1, "engine": "triton"})
            assert r.status_code == 201, r.text
            names.append(name)
    return names


def feeds(seed: int, seq: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 5000, (1, seq), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def v2_body(inputs: dict[str, np.ndarray]) -> dict:
    return {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "INT64", "data": a.ravel().tolist()}
                       for n, a in inputs.items()]}


def v2_logits(body: dict) -> np.ndarray:
    out = next(o for o in body["outputs"] if o["name"] == "logits")
    return np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])


def direct_logits(paths: list[Path], inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Each model run directly with onnxruntime on the same input (one session at a time)."""
    import onnxruntime as ort

    return [ort.InferenceSession(str(p)).run(["logits"], inputs)[0] for p in paths]


def triton_process(stack: Stack, name: str = "triton") -> tuple[psutil.Process, str, str]:
    """(tritonserver process, its HTTP address, its model-repository access token)."""
    root = psutil.Process(stack.procs[name].pid)
    server = next(p for p in root.children(recursive=True) if p.cmdline() and p.cmdline()[0].endswith("/tritonserver"))
    token = re.search(r"triton-access-token=([^\s,;]+)", " ".join(server.cmdline())).group(1)
    return server, f"127.0.0.1:{stack.env['SERVING_TRITON_HTTP_PORT']}", token


def loader_status(stack: Stack) -> dict:
    r = httpx.get(f"{stack.env['SERVING_TRITON_LOADER_URL']}/models", headers=stack.headers("worker"), timeout=10)
    r.raise_for_status()
    return r.json()


def wait_admitted(stack: Stack, names: list[str], timeout: float) -> float:
    """Wait until every model was loaded once (loadable on demand); returns the seconds it took."""
    t0 = time.monotonic()
    wanted = {f"{n}_v1" for n in names}
    while time.monotonic() - t0 < timeout:
        try:
            models = loader_status(stack)["models"]
        except httpx.HTTPError:
            models = {}
        failed = {n: m["error"] for n, m in models.items() if m["state"] == "failed"}
        assert not failed, failed
        if all(models.get(n, {}).get("loadable") for n in wanted):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise TimeoutError(f"not every model was admitted within {timeout}s: {loader_status(stack)}")


@dataclass
class Watch:
    """Samples Triton's repository index and its stubs' resident memory every ``period_s``."""

    server: psutil.Process
    http: str
    token: str
    period_s: float = 0.1
    max_held: int = 0            # models at once in a state holding memory (READY, LOADING, UNLOADING)
    max_stub_bytes: int = 0      # stubs' RSS summed, at its highest
    ever_ready: set[str] = field(default_factory=set)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> "Watch":
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self.period_s):
                try:
                    r = client.post(f"http://{self.http}/v2/repository/index", json={},
                                    headers={"triton-access-token": self.token})
                    index = r.json() if r.status_code == 200 else []
                except httpx.HTTPError:
                    continue
                held = [m["name"] for m in index if m.get("state") in HELD]
                self.ever_ready |= {m["name"] for m in index if m.get("state") == "READY"}
                self.max_held = max(self.max_held, len(held))
                self.max_stub_bytes = max(self.max_stub_bytes, sum(stub_memory(self.server.pid).values()))
                self.samples += 1

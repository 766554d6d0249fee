"""A real `serving worker` (N processes, HTTP and gRPC ports) serving a snapshot from its cache file.

No control plane: the worker applies its cached snapshot at start and keeps retrying a control
plane that is not there (``127.0.0.1:9``), which changes nothing for these tests. Started with
tests/serving/stack.py's Stack, as every test starts processes.
"""
from __future__ import annotations

import subprocess
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import onnx
import psutil
from onnx import TensorProto, helper

from registry.signature import onnx_signature
from serving.config_client import write_cache
from serving.worker.handoff import READY_LOG
from tests.serving.stack import make_stack
from tests.support.procs import free_port, wait_until


@dataclass
class Worker:
    proc: subprocess.Popen
    http_port: int
    grpc_port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def children(self) -> list[psutil.Process]:
        """The worker processes (multiprocessing's resource tracker aside)."""
        alive = []
        for child in psutil.Process(self.proc.pid).children():
            try:
                if child.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(child.cmdline()):
                    alive.append(child)
            except psutil.Error:  # killed and not reaped yet by the manager
                continue
        return alive

    def connections_per_process(self, port: int) -> dict[int, int]:
        """Established connections each worker process holds on ``port`` (what the kernel handed it)."""
        return {c.pid: sum(1 for k in c.net_connections("tcp") if k.laddr and k.laddr.port == port
                           and k.status == psutil.CONN_ESTABLISHED) for c in self.children()}


@contextmanager
def run_worker(home: Path, snapshot: dict, processes: int = 1, **env: str) -> Iterator[Worker]:
    """``serving worker --workers N`` of a test stack (tests/serving/stack.py), gRPC on a free port."""
    stack = make_stack(home, workers=1)
    cache = home / "worker-config.json"
    write_cache(cache, snapshot)
    http_port, grpc_port = stack.worker_ports[0], free_port()
    extra = {"SERVING_ARTIFACT_DIR": str(home / "artifacts"), "SERVING_CONTROL_PLANE_URL": "http://127.0.0.1:9",
             "SERVING_WORKER_CACHE": str(cache), "SERVING_WORKER_PORT": str(http_port),
             "SERVING_WORKER_GRPC_PORT": str(grpc_port), "SERVING_STATISTICS_ENABLED": "false",
             "SERVING_INFER_TIMEOUT_S": "2", **env}  # SERVING_TRITON_GRPC_URL: a free port, no Triton there
    try:
        proc = stack.start("worker", ["worker", "--workers", str(processes)], f"{stack.worker_url()}/v2/health/ready",
                           extra, timeout=120)
        worker = Worker(proc, http_port, grpc_port, stack.log("worker"))
        wait_processes(worker, processes)
        yield worker
    finally:
        stack.stop_all()


def wait_processes(worker: Worker, processes: int, timeout: float = 120) -> None:
    """Every process started: with several, each says in the log it takes the manager's
    connections (serving/worker/handoff.py); one process listens on the gRPC port itself (its
    HTTP socket is the manager's)."""
    if processes > 1:
        def taking() -> bool:
            live = {c.pid for c in worker.children()}
            said = {int(line.split("process ")[1].split()[0]) for line in worker.log.read_text().splitlines()
                    if READY_LOG in line}
            return len(live) == processes and live <= said

        wait_until(taking, timeout, f"{processes} worker processes taking connections",
                   on_timeout=lambda: worker.log.read_text()[-3000:])
        return
    ports = (worker.grpc_port,)

    def listening() -> bool:
        children = worker.children()
        bound = [sum(1 for c in children for k in c.net_connections("tcp")
                     if k.laddr and k.laddr.port == port and k.status == psutil.CONN_LISTEN) for port in ports]
        return len(children) == processes and bound == [processes] * len(ports)

    wait_until(listening, timeout, f"{processes} worker processes listening",
               on_timeout=lambda: worker.log.read_text()[-3000:])


def tensor_model(path: Path) -> Path:
    """Several inputs and outputs, one of them BYTES: ``y = x + x`` (FP32), ``n = Size(x)`` (INT64),
    ``t = s`` (STRING) -- what onnxruntime computes is easy to state, and a string tensor travels both ways."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "x"], ["y"]), helper.make_node("Size", ["x"], ["n"]),
         helper.make_node("Identity", ["s"], ["t"])], "tensors",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("s", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
         helper.make_tensor_value_info("n", TensorProto.INT64, []),
         helper.make_tensor_value_info("t", TensorProto.STRING, ["batch"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    return path


def tensor_spec(name: str, model_path: Path, store, versions=((1, 100.0),)) -> dict:
    sha = store.put_file(model_path)[0]
    signature = onnx_signature(model_path)
    return {"name": name, "engine": "onnxruntime", "preprocess": {"kind": "none"}, "metrics": [], "log_freq": 1.0,
            "batching": {"max_batch_size": 8, "max_queue_delay_us": 0, "preferred_batch_sizes": [], "instances": 1},
            "targets": [{"model": name, "version": v, "weight": w, "role": "stable" if i == 0 else "canary",
                         "triton_name": f"{name}_v{v}", "artifact": sha, "framework": "onnx",
                         "signature": signature} for i, (v, w) in enumerate(versions)]}


def tensor_feeds() -> dict[str, np.ndarray]:
    return {"x": np.arange(6, dtype=np.float32).reshape(2, 3) / 7,
            "s": np.array(["café".encode(), "naïve 東京".encode()], dtype=np.object_)}


def ort_direct(path: Path, feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
    """The model run by onnxruntime itself, string tensors given as str (what onnxruntime takes)."""
    import onnxruntime as ort

    plain = {k: np.array([b.decode() for b in v.ravel()], dtype=object).reshape(v.shape) if v.dtype == np.object_
             else v for k, v in feeds.items()}
    return ort.InferenceSession(str(path)).run(outputs, plain)


def tensor_inputs(module, feeds: dict[str, np.ndarray]) -> list:
    inputs = []
    for name, array in feeds.items():
        datatype = "BYTES" if array.dtype == np.object_ else {"float32": "FP32", "int64": "INT64"}[str(array.dtype)]
        tensor = module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs

"""Several worker processes on one HTTP and one gRPC port: connections shared out by the kernel
(a SO_REUSEPORT socket per process); a process killed with SIGKILL is replaced and new connections
are never refused meanwhile (the live processes take them; a lone process's socket waits for it)."""
from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import grpc
import httpx
import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient

from registry.artifacts import ArtifactStore
from tests.serving.worker.grpc_worker import (run_worker, tensor_feeds, tensor_inputs, tensor_model, tensor_spec,
                                              wait_processes)
from tests.serving.worker.support import snapshot

CONNECTIONS = 16
LOCAL_POOL = [("grpc.use_local_subchannel_pool", 1)]  # a connection per client, as separate client processes have


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    paths = tmp_path_factory.mktemp("grpc-procs")
    store = ArtifactStore(paths / "home" / "artifacts")
    spec = tensor_spec("tensors", tensor_model(paths / "tensors.onnx"), store)
    with run_worker(paths / "home", snapshot(spec), processes=2) as w:
        yield w


def grpc_inputs() -> list:
    return tensor_inputs(grpcclient, tensor_feeds())


def assert_shared(per_process: dict[int, int]) -> None:
    """16 connections hashed over 2 sockets: each process gets Binomial(16, 1/2); at least 2 each
    fails a fair kernel about once in 1,800 runs (a shared socket often gave one process all 16)."""
    assert len(per_process) == 2 and sum(per_process.values()) == CONNECTIONS, per_process
    assert min(per_process.values()) >= 2, per_process


def test_http_connections_are_shared_between_processes(worker):
    clients = [httpx.Client(base_url=worker.url, timeout=30) for _ in range(CONNECTIONS)]
    try:
        with ThreadPoolExecutor(CONNECTIONS) as pool:  # all at once, as a load generator opens them
            assert all(r.status_code == 200 for r in pool.map(lambda c: c.get("/v2/health/live"), clients))
        assert_shared(worker.connections_per_process(worker.http_port))
    finally:
        for c in clients:
            c.close()


def test_grpc_connections_are_shared_between_processes(worker):
    clients = [grpcclient.InferenceServerClient(worker.grpc, channel_args=LOCAL_POOL) for _ in range(CONNECTIONS)]
    try:
        with ThreadPoolExecutor(CONNECTIONS) as pool:
            assert all(pool.map(lambda c: c.is_server_live(), clients))
        assert_shared(worker.connections_per_process(worker.grpc_port))
    finally:
        for c in clients:
            c.close()


def fresh_connection_codes(worker, count: int = 24) -> list[int]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda _: httpx.get(f"{worker.url}/v2/health/live", timeout=90).status_code,
                             range(count)))


def test_a_killed_process_is_replaced_and_the_live_one_takes_new_connections(worker):
    victim = worker.children()[0]
    os.kill(victim.pid, signal.SIGKILL)
    psutil.wait_procs([victim], timeout=10)  # its sockets close with it: the group holds the live one only
    assert fresh_connection_codes(worker) == [200] * 24
    for _ in range(8):  # gRPC likewise: new connections go to the live process
        c = grpcclient.InferenceServerClient(worker.grpc, channel_args=LOCAL_POOL)
        try:
            result = c.infer("tensors", grpc_inputs())
        finally:
            c.close()
        np.testing.assert_array_equal(result.as_numpy("y"), tensor_feeds()["x"] * 2)
    wait_processes(worker, 2)  # the replacement joins once it has started
    assert victim.pid not in {c.pid for c in worker.children()}
    with grpc.insecure_channel(worker.grpc, options=LOCAL_POOL) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)


def test_one_process_killed_new_connections_wait_for_its_replacement(tmp_path):
    """One process: its socket is held by the manager, so connections queue instead of being refused."""
    store = ArtifactStore(tmp_path / "home" / "artifacts")
    spec = tensor_spec("tensors", tensor_model(tmp_path / "tensors.onnx"), store)
    with run_worker(tmp_path / "home", snapshot(spec), processes=1) as one:
        victim = one.children()[0]
        os.kill(victim.pid, signal.SIGKILL)
        psutil.wait_procs([victim], timeout=10)
        assert fresh_connection_codes(one, 8) == [200] * 8
        wait_processes(one, 1)

"""Several worker processes on one HTTP and one gRPC port: the manager hands each connection to
the process holding the fewest (serving/worker/handoff.py), so 16 connections opened at once are
exactly 8 and 8, on HTTP and on gRPC; a process killed with SIGKILL is replaced and new
connections are never refused meanwhile (the live process takes them; a lone process's socket
waits for it)."""
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
from tests.support.procs import wait_until

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
    """Exactly even: the manager counts live connections (the kernel's hash gave 11/5 and 13/3, a
    shared socket often all 16 to one process)."""
    assert len(per_process) == 2 and sorted(per_process.values()) == [CONNECTIONS // 2] * 2, per_process


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


def holder_of(worker, port: int) -> dict[int, int]:
    """Client-side local port -> pid of the worker process holding the other end."""
    return {k.raddr.port: c.pid for c in worker.children() for k in c.net_connections("tcp")
            if k.laddr and k.laddr.port == port and k.raddr and k.status == psutil.CONN_ESTABLISHED}


def test_new_connections_go_to_the_process_holding_the_fewest(worker):
    """Least connections, not round robin nor a hash: after the client closes every connection one
    process held, the next connections all go to that process until the shares are even again."""
    import socket

    def connect() -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", worker.http_port))
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: w\r\n\r\n")
        assert b" 200 " in sock.recv(4096)
        return sock

    socks = [connect() for _ in range(8)]
    try:
        owner = holder_of(worker, worker.http_port)
        emptied = owner[socks[0].getsockname()[1]]
        for sock in [s for s in socks if owner[s.getsockname()[1]] == emptied]:
            socks.remove(sock)
            sock.close()
        wait_until(lambda: worker.connections_per_process(worker.http_port).get(emptied) == 0, 10,
                   "the closes to reach the process")
        socks += [connect() for _ in range(4)]
        assert sorted(worker.connections_per_process(worker.http_port).values()) == [4, 4]
        owner = holder_of(worker, worker.http_port)
        assert [owner[s.getsockname()[1]] for s in socks[-4:]] == [emptied] * 4
    finally:
        for sock in socks:
            sock.close()


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

"""The manager's side of the hand-off (serving/worker/handoff.py) in-process, on real sockets: the
"processes" are channel ends held by the test, so what each is handed can be read exactly.
The same mechanism across real worker processes: test_grpc_processes.py."""
from __future__ import annotations

import socket

import pytest

from serving.worker.handoff import CLOSED, HTTP, READY, Balancer
from tests.support.procs import wait_until


@pytest.fixture
def balancer():
    listener = socket.create_server(("127.0.0.1", 0))
    b = Balancer({HTTP: listener}).start()
    yield b
    b.stop()


def handed(channel: socket.socket, timeout: float = 5.0) -> list[socket.socket]:
    """Every connection handed on ``channel`` until it has been quiet a moment."""
    got = []
    channel.settimeout(timeout)
    try:
        while True:
            message, fds, _, _ = socket.recv_fds(channel, 16, 1)
            assert message == HTTP and len(fds) == 1
            got.append(socket.socket(fileno=fds[0]))
            channel.settimeout(0.3)
    except (TimeoutError, socket.timeout):
        return got


def connect(b: Balancer, n: int) -> list[socket.socket]:
    port = b.listeners[HTTP].getsockname()[1]
    return [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]


def test_connections_wait_in_the_backlog_until_a_process_is_ready(balancer):
    process = balancer.channel()
    clients = connect(balancer, 3)  # accepted by the kernel's backlog, not handed to anyone
    assert handed(process, timeout=0.5) == []
    process.send(READY)
    conns = handed(process)
    assert len(conns) == 3
    conns[0].sendall(b"x")  # really the client's connection
    assert clients[0].recv(1) == b"x"


def test_each_connection_goes_to_the_ready_process_holding_the_fewest(balancer):
    a, b = balancer.channel(), balancer.channel()
    a.send(READY)
    b.send(READY)
    wait_until(lambda: len(balancer.shares()) == 2, 5, "both processes ready")
    clients = connect(balancer, 6)
    got_a, got_b = handed(a), handed(b)
    assert (len(got_a), len(got_b)) == (3, 3)
    a.send(CLOSED * 3)  # a's three ended: the next three all go to a
    wait_until(lambda: balancer.shares() == [3, 0], 5, "the closes counted")
    clients += connect(balancer, 3)
    assert (len(handed(a)), len(handed(b, timeout=0.5))) == (3, 0)
    for s in clients + got_a + got_b:
        s.close()


def test_a_process_that_is_gone_gets_nothing_more(balancer):
    a, b = balancer.channel(), balancer.channel()
    a.send(READY)
    b.send(READY)
    wait_until(lambda: len(balancer.shares()) == 2, 5, "both processes ready")
    b.close()
    wait_until(lambda: len(balancer.shares()) == 1, 5, "the manager to see it gone")
    clients = connect(balancer, 4)
    assert len(handed(a)) == 4
    for s in clients:
        s.close()

"""Ports handed to processes that bind them later are never ones an outgoing connection can take."""
from __future__ import annotations

import socket

from serving import ports
from serving.ports import LISTEN_PORTS, ephemeral_range, free_port


def test_ports_are_below_the_ephemeral_range_free_and_not_repeated():
    low, high = ephemeral_range()
    assert (low, high) != (0, 0) and low <= high
    got = [free_port() for _ in range(300)]
    assert len(set(got)) == len(got)  # one process never hands the same port out twice in a row
    for port in got:
        assert LISTEN_PORTS[0] <= port < LISTEN_PORTS[1] and not low <= port <= high
    with socket.socket() as s:
        s.bind(("127.0.0.1", got[-1]))  # free indeed


def test_a_port_something_listens_on_is_skipped(monkeypatch):
    busy, free = free_port(), free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", busy))
        taken.listen()
        picks = iter([busy, free])
        monkeypatch.setattr(ports._random, "randrange", lambda a, b: next(picks))
        monkeypatch.setattr(ports, "_recent", ports.deque(maxlen=8))
        assert free_port() == free


def test_where_the_ephemeral_range_covers_ours_the_kernel_chooses(monkeypatch, tmp_path):
    fake = tmp_path / "range"
    fake.write_text("1024\t65535\n")
    monkeypatch.setattr(ports, "EPHEMERAL_RANGE", fake)
    assert ephemeral_range() == (1024, 65535)
    assert 1024 <= free_port() <= 65535

"""Free loopback ports for the processes the platform (and its tests and benchmarks) start.

Why not the kernel's choice (``bind(("127.0.0.1", 0))``): that port comes from the ephemeral range,
the same one every outgoing connection takes its local port from. A port picked so and handed to a
process that binds it later (a vLLM engine binds its port 30-60 s after it starts importing) can be
taken meanwhile by any connection on the machine; the engine then dies with "address already in
use" (it did, under the test suite's load). A port below the ephemeral range is never handed to a
connection; it is picked at random among the free ones, so that processes picking at once rarely
meet, and one process never hands the same port out twice in a row.
"""
from __future__ import annotations

import random
import socket
from collections import deque
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LISTEN_PORTS = (20000, 30000)  # below Linux's default ephemeral range (32768-60999) and Kubernetes' NodePorts
_recent: deque[int] = deque(maxlen=512)
_random = random.SystemRandom()  # not seeded alike in forked processes


def ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(x) for x in EPHEMERAL_RANGE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, outside the ephemeral range where that range leaves room."""
    low, high = ephemeral_range()
    if not (high < LISTEN_PORTS[0] or low >= LISTEN_PORTS[1]):  # the range overlaps ours: the kernel's choice
        with socket.socket() as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    for _ in range(200):
        port = _random.randrange(*LISTEN_PORTS)
        if port not in _recent and _bindable(host, port):
            _recent.append(port)
            return port
    raise OSError(f"no free port in {LISTEN_PORTS[0]}-{LISTEN_PORTS[1] - 1} after 200 tries")

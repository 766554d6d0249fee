"""The statistics of every process of one worker, so Triton's statistics extension answers for the worker.

With ``serving worker --workers N`` a request lands on one process, and so does a statistics
request: alone, it could only say what its own process served. Each process therefore listens on a
private abstract Unix socket, ``serving-stats-<manager pid>-<pid>-<random>``, and answers a
connection with its counters as JSON (version_stats.py rows, and its requests in flight: load.py). A
statistics request (or a read of the worker's load) asks every sibling listed in ``/proc/net/unix``
under its manager's prefix and sums their answers with its own: exact at the moment of asking, nothing shared to corrupt, nothing on disk to clean up (an abstract socket
goes with its process). Only a process of the same user is answered (``SO_PEERCRED``).

The group is the uvicorn manager (``multiprocessing.parent_process``); a worker built in a test
process, with no manager, counts alone. A process that died took its counts with it; a sibling that
does not answer within ``TIMEOUT_S`` fails the statistics request (503), rather than giving a total
that quietly leaves it out. Linux only, as the connection hand-off is (handoff.py).
"""
from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import socket
import struct
from pathlib import Path
from typing import Any, Callable

import orjson

from serving.worker.errors import Unavailable

log = logging.getLogger(__name__)
PREFIX = "serving-stats-"
TIMEOUT_S = 5.0
LISTENING = 0x00010000  # __SO_ACCEPTCON in /proc/net/unix's Flags column
MAX_ANSWER = 64 << 20


def group() -> int | None:
    """The manager's pid when this process is one of a ``serving worker``'s processes."""
    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None else None


def siblings(group_id: int, own: str, table: Path = Path("/proc/net/unix")) -> list[str]:
    """The listening statistics sockets of the other processes of this worker."""
    prefix, names = f"@{PREFIX}{group_id}-", []
    try:
        lines = table.read_text().splitlines()[1:]
    except OSError:
        return []
    for line in lines:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith(prefix) and int(fields[3], 16) & LISTENING:
            name = fields[7][1:]
            if name != own and name not in names:
                names.append(name)
    return names


class StatsExchange:
    """One per worker process: serves its rows, and gathers its siblings'."""

    def __init__(self, rows: Callable[[], Any], group_id: int | None) -> None:
        self.rows, self.group_id = rows, group_id
        self.name = f"{PREFIX}{group_id}-{os.getpid()}-{os.urandom(4).hex()}" if group_id else None
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        if self.name is None:
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind("\0" + self.name)
        except OSError as exc:  # no abstract sockets (not Linux): this process counts alone
            log.warning("statistics stay this process's own: cannot listen for its siblings (%s)", exc)
            sock.close()
            self.name = None
            return
        sock.listen(16)
        sock.setblocking(False)
        self._server = await asyncio.get_running_loop().create_unix_server(self._protocol, sock=sock)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _protocol(self) -> asyncio.Protocol:
        exchange = self

        class Answer(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                uid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
                if uid == os.getuid():
                    transport.write(orjson.dumps(exchange.rows()))  # type: ignore[attr-defined]
                transport.close()
        return Answer()

    async def gather(self) -> list[Any]:
        """Every process's answer (what ``rows`` returns, as JSON), this one's first."""
        own = self.rows()
        if self.name is None or self.group_id is None:
            return [own]
        names = siblings(self.group_id, self.name)
        results = await asyncio.gather(*(self._ask(name) for name in names))
        return [own, *(rows for rows in results if rows is not None)]

    async def _ask(self, name: str) -> Any:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            try:
                await asyncio.wait_for(loop.sock_connect(sock, "\0" + name), TIMEOUT_S)
            except (ConnectionRefusedError, FileNotFoundError):
                return None  # the process is gone (its counts with it)
            chunks, size = [], 0
            async with asyncio.timeout(TIMEOUT_S):
                while chunk := await loop.sock_recv(sock, 1 << 16):
                    size += len(chunk)
                    if size > MAX_ANSWER:
                        raise ValueError("answer too large")
                    chunks.append(chunk)
            return orjson.loads(b"".join(chunks))
        except (OSError, TimeoutError, ValueError) as exc:
            log.warning("worker process statistics %s did not answer: %s", name, exc)
            raise Unavailable("a worker process did not report its statistics in time; ask again",
                              retry_after_s=1) from None
        finally:
            sock.close()

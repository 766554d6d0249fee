"""Connections handed out by the manager, each to the worker process holding the fewest.

``SO_REUSEPORT`` (listeners.py, ``SERVING_WORKER_BALANCE=kernel``) gives every process
connections, but the kernel hashes each connection's addresses to a socket: 16 connections went
11/5 and 13/3 over two processes, and a process with 11 serves them at its own speed while the
other idles part of the time. Here the manager alone accepts, on one listening socket per port,
and passes each accepted socket (``SCM_RIGHTS`` over a Unix channel per process) to the ready
process with the fewest live connections, the least recently chosen among equals: Envoy's
"exact balance". Processes say when they are ready (app started, models loaded) and when each
connection closes, so the count is live connections, not connections ever handed out.

HTTP sockets go straight into the process's uvicorn (``connect_accepted_socket``). gRPC's server
cannot adopt a socket, so each process's gRPC server listens on a private Unix socket and a
handed gRPC connection is relayed to it by the process's event loop (``Relay``): the cost is a
copy per message, measured in docs/benchmarks.md. Accepting costs the manager one ``accept``
and one ``sendmsg`` a connection, nothing a request: keep-alive connections pay it once.

While no process is ready (all starting, or restarting), the manager stops accepting: new
connections wait in the listening socket's backlog instead of being refused.
"""
from __future__ import annotations

import asyncio
import logging
import os
import selectors
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

log = logging.getLogger(__name__)
READY_LOG = "takes connections from the manager"  # logged by each process once it is ready

HTTP, GRPC = b"h", b"g"  # what a handed socket is for: the message that carries it
READY, CLOSED = b"R", b"-"  # from a process: it takes connections now / one of its connections closed


@dataclass
class Slot:
    channel: socket.socket
    ready: bool = False
    live: int = 0
    last_chosen: int = 0


@dataclass
class Balancer:
    """Manager side: one thread accepts on ``listeners`` (kind -> listening socket) and hands out."""

    listeners: dict[bytes, socket.socket]
    slots: dict[int, Slot] = field(default_factory=dict)  # by the manager's channel fd
    handed: int = 0

    def __post_init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._new: list[socket.socket] = []
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._accepting = False
        self._stop = threading.Event()
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        for sock in self.listeners.values():
            sock.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="handoff", daemon=True)

    def start(self) -> "Balancer":
        self._thread.start()
        return self

    def channel(self) -> socket.socket:
        """A new process's end of a fresh channel (give it to the process, then close it here)."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        with self._lock:
            self._new.append(mine)
        self._wake_w.send(b"!")
        return theirs

    def stop(self) -> None:
        self._stop.set()
        self._wake_w.send(b"!")
        self._thread.join(timeout=5)
        for slot in self.slots.values():
            slot.channel.close()
        for sock in self.listeners.values():
            sock.close()

    def shares(self) -> list[int]:
        """Live connections per ready process (for logs and tests)."""
        return sorted((s.live for s in self.slots.values() if s.ready), reverse=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=1.0):
                if key.data == "wake":
                    self._drain_wake()
                elif key.data == "listen":
                    self._accept(key.fileobj)  # type: ignore[arg-type]
                else:
                    self._from_process(key.data)
            self._set_accepting(any(s.ready for s in self.slots.values()))

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(64):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            new, self._new = self._new, []
        for chan in new:
            self.slots[chan.fileno()] = Slot(chan)
            self._selector.register(chan, selectors.EVENT_READ, chan.fileno())

    def _set_accepting(self, on: bool) -> None:
        """Listen only while some process can take connections; meanwhile they queue in the backlog."""
        if on == self._accepting:
            return
        for sock in self.listeners.values():
            if on:
                self._selector.register(sock, selectors.EVENT_READ, "listen")
            else:
                self._selector.unregister(sock)
        self._accepting = on

    def _accept(self, listener: socket.socket) -> None:
        kind = next(k for k, s in self.listeners.items() if s is listener)
        while True:
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: leave the rest queued, try again next round
                log.warning("accepting a connection failed: %s", exc)
                return
            with conn:
                if not self._hand(kind, conn):
                    return  # no process could take it: the client sees the close and retries

    def _hand(self, kind: bytes, conn: socket.socket) -> bool:
        for slot in sorted((s for s in self.slots.values() if s.ready), key=lambda s: (s.live, s.last_chosen)):
            try:
                socket.send_fds(slot.channel, [kind], [conn.fileno()])
            except (BlockingIOError, OSError):
                continue  # its channel is full (hung) or gone: the next process
            self.handed += 1
            slot.live += 1
            slot.last_chosen = self.handed
            return True
        return False

    def _from_process(self, fd: int) -> None:
        slot = self.slots[fd]
        try:
            message = slot.channel.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            message = b""
        if not message:  # the process is gone: its connections went with it
            self._selector.unregister(slot.channel)
            slot.channel.close()
            del self.slots[fd]
            return
        slot.ready = slot.ready or READY in message
        slot.live = max(0, slot.live - message.count(CLOSED))


class Receiver:
    """Process side: takes the sockets the manager hands over and reports readiness and closes."""

    def __init__(self, channel: socket.socket, http: Callable[[socket.socket], Any],
                 grpc: Callable[[socket.socket], Any] | None) -> None:
        self.channel = channel
        self.channel.setblocking(False)
        self.handlers = {HTTP: http, GRPC: grpc}
        self._closed = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.channel.fileno(), self._on_readable)
        self._send(READY)
        log.info("process %d %s", os.getpid(), READY_LOG)

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.remove_reader(self.channel.fileno())
        self.channel.close()

    def closed(self) -> None:
        """One handed connection ended; reported at the loop's next turn, several in one message."""
        self._closed += 1
        if self._closed == 1 and self._loop is not None:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        if self._closed and self._send(CLOSED * self._closed):
            self._closed = 0
        elif self._closed and self._loop is not None:
            self._loop.call_later(0.05, self._flush)

    def _send(self, message: bytes) -> bool:
        try:
            self.channel.send(message)
            return True
        except (BlockingIOError, OSError):
            return False

    def _on_readable(self) -> None:
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self.channel, 16, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message, fds = b"", []
            if not message and not fds:  # the manager is gone: nothing more will come
                self._loop.remove_reader(self.channel.fileno())  # type: ignore[union-attr]
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                conn.setblocking(False)
                handler = self.handlers.get(message[:1])
                if handler is None:
                    conn.close()
                    self.closed()
                else:
                    handler(conn)


class Relay(asyncio.Protocol):
    """One side of a byte pipe between a handed gRPC connection and the process's own gRPC server;
    back-pressure passes through (a slow reader pauses the other side's reading)."""

    def __init__(self, on_close: Callable[[], None] | None = None) -> None:
        self.peer: Relay | None = None
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.on_close = on_close

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write(data)
        else:
            self.pending.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()
        if self.on_close is not None:
            self.on_close()
            self.on_close = None

    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


async def relay(conn: socket.socket, grpc_name: str, on_close: Callable[[], None]) -> None:
    """Join a handed gRPC connection to the process's own gRPC server (abstract socket ``grpc_name``)."""
    loop = asyncio.get_running_loop()
    outside, inside = Relay(on_close), Relay()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.setblocking(False)
    try:
        await loop.connect_accepted_socket(lambda: outside, conn)
        await loop.sock_connect(server, "\0" + grpc_name)  # uvloop refuses an abstract path as an address
        await loop.create_unix_connection(lambda: inside, sock=server)
    except OSError as exc:
        log.warning("a gRPC connection could not reach this process's gRPC server: %s", exc)
        server.close()
        if outside.transport is not None:
            outside.transport.close()  # its connection_lost reports the close
        else:
            conn.close()
            on_close()
        return
    outside.peer, inside.peer = inside, outside
    for side in (outside, inside):  # what either sent before the other end was joined (the server's SETTINGS)
        for data in side.pending:
            side.peer.transport.write(data)  # type: ignore[union-attr]
        side.pending.clear()
    if outside.transport.is_closing():  # type: ignore[union-attr]  # the client left meanwhile
        inside.transport.close()  # type: ignore[union-attr]


# This process's gRPC server listens on this abstract Unix socket when the manager hands out
# connections (set by listeners.HandoffServer before the app starts; None: it binds its TCP port).
PROCESS_GRPC_NAME: str | None = None


def private_grpc_name() -> str:
    """An abstract Unix socket name: nothing on disk to clean up, private to this host's namespace."""
    return f"serving-grpc-{os.getpid()}-{os.urandom(4).hex()}"

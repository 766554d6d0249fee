"""How the worker processes get their connections, and uvicorn's manager that keeps them running.

Several processes, ``SERVING_WORKER_BALANCE=connections`` (the default): the manager accepts and
hands each connection to the process holding the fewest (handoff.py). ``kernel``, described
below: one listening socket per worker process (``SO_REUSEPORT``), so no process sits idle.

With one socket shared by every process, whichever process wakes first accepts all the
connections queued at that moment: 16 keep-alive connections opened together could all land in
one process while the others idled (issue 19: 1,988 against 4,925 req/s between two runs). With a
socket per process in one ``SO_REUSEPORT`` group the kernel hashes each new connection's addresses
to one socket, so every process gets connections whatever the client does; the hash does not make
the shares equal (16 connections split 11/5 or 13/3 over two processes in docs/benchmarks.md).

With several processes each binds its own socket once its app has started (config applied, models
loaded: uvicorn binds after the lifespan), as its gRPC server does: a process killed takes its
sockets with it, the kernel hashes new connections over the live ones at once, and the replacement
joins when it is ready. The cost of a kill is its connections: requests in flight, and connections
the kernel had queued on its socket but it had not accepted yet, are reset. With one process there
is no other to take over, so the manager holds that socket for its whole life and hands it to each
replacement: new connections wait in its backlog meanwhile instead of being refused.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import socket

from uvicorn.config import Config
from uvicorn.server import Server
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from serving.worker import handoff

log = logging.getLogger("uvicorn.error")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def ensure_free(host: str, port: int, setting: str) -> None:
    """Refuse a port something else listens on: SO_REUSEPORT alone would quietly share it with
    another server of the same user (a second worker, an old one still running)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers are no conflict
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise SystemExit(f"{host}:{port} is in use ({exc.strerror}); another worker may be running there; "
                             f"choose another port with {setting}") from None


def reuseport_socket(host: str, port: int, backlog: int, reuseport: bool = True) -> socket.socket:
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuseport:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


class LateBindServer(Server):
    """Given an empty socket list, binds its own SO_REUSEPORT socket into it once the app's
    lifespan has started, just before uvicorn starts serving the list."""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if sockets == []:
            lifespan_startup = self.lifespan.startup

            async def started_then_bind() -> None:
                await lifespan_startup()
                if not self.lifespan.should_exit:
                    sockets.append(reuseport_socket(self.config.host, self.config.port, self.config.backlog))

            self.lifespan.startup = started_then_bind  # type: ignore[method-assign]
        await super().startup(sockets)


class OwnServerProcess(Process):
    """uvicorn's worker process, running one of the Server subclasses here."""

    server_class: type[Server] = Server

    @property
    def server(self) -> Server:
        if self._server is None:
            self._server = self.server_class(config=self.config)
        return self._server


class LateBindProcess(OwnServerProcess):
    server_class = LateBindServer


class HandoffServer(Server):
    """Serves the connections the manager hands over (handoff.Receiver) instead of listening:
    HTTP ones in uvicorn's own protocol, gRPC ones relayed to this process's gRPC server, which
    listens on a private Unix socket. Says it is ready only once the app has started."""

    receiver: handoff.Receiver | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        channel = (sockets or [None])[0]
        handoff.PROCESS_GRPC_NAME = handoff.private_grpc_name()
        await super().startup([])
        if self.lifespan.should_exit or channel is None:
            return
        loop = asyncio.get_running_loop()
        create_protocol = functools.partial(self.config.http_protocol_class, config=self.config,
                                            server_state=self.server_state, app_state=self.lifespan.state)

        def http(conn: socket.socket) -> None:
            loop.create_task(loop.connect_accepted_socket(lambda: self._counted(create_protocol()), conn,
                                                          ssl=self.config.ssl))

        def grpc(conn: socket.socket) -> None:
            loop.create_task(handoff.relay(conn, handoff.PROCESS_GRPC_NAME or "", self.receiver.closed))

        self.receiver = handoff.Receiver(channel, http, grpc)
        self.receiver.start()

    def _counted(self, protocol: asyncio.Protocol) -> asyncio.Protocol:
        """The manager counts live connections: tell it when this one ends."""
        lost = protocol.connection_lost

        def connection_lost(exc: Exception | None) -> None:
            try:
                lost(exc)
            finally:  # counted even when uvicorn's own clean-up fails
                if self.receiver is not None:
                    self.receiver.closed()

        protocol.connection_lost = connection_lost  # type: ignore[method-assign]
        return protocol

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.receiver is not None:  # first: no new connection comes while this one drains
            self.receiver.stop()
        await super().shutdown(sockets)


class HandoffProcess(OwnServerProcess):
    server_class = HandoffServer


class ReusePortProcesses(Multiprocess):
    """uvicorn's supervisor (health pings, restart of a dead or hung process, SIGHUP restarts,
    a start-up failure stops everything), each process with its own socket, or, with a
    ``balancer``, with connections handed out by this process."""

    def __init__(self, config: Config, processes: int, grpc_port: int = 0, balance: str = "connections") -> None:
        self.balancer: handoff.Balancer | None = None
        if processes > 1 and balance == "connections":
            listeners = {handoff.HTTP: reuseport_socket(config.host, config.port, config.backlog, reuseport=False)}
            if grpc_port:
                listeners[handoff.GRPC] = reuseport_socket(config.host, grpc_port, config.backlog, reuseport=False)
            self.balancer = handoff.Balancer(listeners).start()
        held = [reuseport_socket(config.host, config.port, config.backlog)] if processes == 1 else []
        super().__init__(config, held)
        self.processes_num = processes

    def _spawn(self, slot: int) -> Process:
        if self.balancer is not None:
            channel = self.balancer.channel()
            process: Process = HandoffProcess(self.config, [channel])
            process.start()
            channel.close()  # the child has its own copy: the manager sees EOF when the child is gone
            return process
        process = Process(self.config, self.sockets) if self.sockets else LateBindProcess(self.config, [])
        process.start()
        return process

    def terminate_all(self) -> None:
        if self.balancer is not None:  # stop handing out before the processes drain
            self.balancer.stop()
        super().terminate_all()

    def init_processes(self) -> None:
        self.processes = [self._spawn(slot) for slot in range(self.processes_num)]

    def keep_subprocess_alive(self) -> None:
        from uvicorn.config import STARTUP_FAILURE

        for slot, process in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            if process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            process.kill()
            process.join()
            if process.exitcode == STARTUP_FAILURE:  # would fail the same way again: stop
                log.error("worker process [%s] failed to start; stopping", process.pid)
                self.should_exit.set()
                return
            log.warning("worker process [%s] died (exit code %s); starting another",
                        process.pid, process.exitcode)
            self.processes[slot] = self._spawn(slot)

    def restart_all(self) -> None:
        """SIGHUP: each slot's replacement serves before the old process stops."""
        for slot, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self._spawn(slot)
            if not new.wait_until_ready(self.config.timeout_worker_healthcheck, self.should_exit):
                new.kill()
                new.join()
                log.error("replacement of worker process [%s] was not ready in time; keeping it", old.pid)
                return
            old.terminate()
            old.join()
            self.processes[slot] = new

    def handle_ttin(self) -> None:
        log.info("SIGTTIN ignored: the number of worker processes is fixed by --workers")

    def handle_ttou(self) -> None:
        log.info("SIGTTOU ignored: the number of worker processes is fixed by --workers")

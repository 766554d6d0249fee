"""Several Triton servers behind one worker: spread the calls, survive one dying.

Why: a gRPC channel is one HTTP/2 connection, so a worker pointed at a Kubernetes Service keeps
every call on the one pod kube-proxy chose for it. With ``triton.replicas`` > 1 the worker is
given a headless Service instead (``dns:///<name>:<port>``: one address per ready Triton pod) or
an explicit ``host:port,host:port`` list, and keeps one ``tritonclient.grpc.aio`` client per
address.

- **Spread**: each call goes to the address with the fewest calls in flight from this process;
  ties rotate, so an idle worker still alternates.
- **Failover**: inference has no side effects, so a call that finds its server unreachable
  (connection refused or reset, UNAVAILABLE: a pod killed) is made again on another address,
  and that address is taken out. A call whose model is not loaded on one server yet (a pod just
  restarted, still loading) also tries another; that one is not taken out. A call that used its
  whole deadline is not retried: the client has already waited the timeout.
- **Coming back**: an address taken out is asked ``is_server_live`` every ``PROBE_PERIOD_S``
  on a fresh channel (an old one would wait out gRPC's reconnect backoff, up to minutes) and
  used again once it answers.
- **Pods come and go**: the name is resolved again every ``resolve_period_s``; new addresses
  join, vanished ones are dropped once their calls finish. A failed or empty lookup keeps the
  addresses known (the name's server may be the one restarting). A call that found every known
  address unreachable looks the name up at once (at most every ``RESOLVE_AGAIN_S``) and tries the
  new ones: a rollout can replace every pod a worker knows within one period.

Model readiness (the readiness gate) is true when every address that answers has the model
ready, and at least one answers: a version is routed to once every live server holds it.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import tritonclient.grpc.aio as grpc_aio

from serving.dns import addresses
from serving.worker.engines.triton_channels import DNS_PREFIX, Call, T, call_on, model_ready_sync
from serving.worker.errors import ModelNotReady, Unavailable

log = logging.getLogger(__name__)

PROBE_PERIOD_S = 0.5
RESOLVE_AGAIN_S = 0.5  # the least time between two lookups made because every address failed


def dns_lookup(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, as ``ip:port`` (``[ip]:port`` for IPv6), sorted."""
    return sorted(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}"
                  for family, ip in addresses(host, port, "Triton address"))


@dataclass(frozen=True)
class AddressSource:
    """Where the addresses come from: a fixed list, or a name resolved by ``lookup`` (a seam
    for tests: the resolver, not the name service, is replaced)."""

    setting: str
    fixed: tuple[str, ...] = ()
    host: str = ""
    port: int = 0
    lookup: Callable[[str, int], list[str]] = dns_lookup

    def resolve(self) -> list[str]:
        return list(self.fixed) if self.fixed else self.lookup(self.host, self.port)


def addresses_source(setting: str, lookup: Callable[[str, int], list[str]] = dns_lookup) -> AddressSource:
    """``dns:///name:port`` or ``host:port,host:port`` (see the module docstring)."""
    setting = setting.strip()
    if setting.startswith(DNS_PREFIX):
        host, sep, port = setting.removeprefix(DNS_PREFIX).rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"Triton address {setting!r}: expected dns:///name:port")
        return AddressSource(setting, host=host.strip("[]"), port=int(port), lookup=lookup)
    fixed = tuple(dict.fromkeys(a.strip() for a in setting.split(",") if a.strip()))
    if not fixed:
        raise ValueError(f"Triton address {setting!r}: no host:port in it")
    return AddressSource(setting, fixed=fixed)


@dataclass
class Member:
    """One Triton server, as this worker process sees it."""

    url: str
    client: grpc_aio.InferenceServerClient | None = None
    in_flight: int = 0
    down: bool = False
    calls: int = 0  # answered calls (tests and logs)

    def aio(self) -> grpc_aio.InferenceServerClient:
        if self.client is None:
            self.client = grpc_aio.InferenceServerClient(self.url)
        return self.client


class TritonPool:
    """The channels object (serving/worker/engines/triton_channels.py) for several servers."""

    def __init__(self, source: AddressSource, resolve_period_s: float = 5.0,
                 probe_period_s: float = PROBE_PERIOD_S) -> None:
        self.source = source
        self.url = source.setting
        self.resolve_period_s = resolve_period_s
        self.probe_period_s = probe_period_s
        self.members: dict[str, Member] = {}
        self._retired: list[Member] = []
        self._lock = threading.Lock()  # members change from the event loop and the config thread
        self._turn = itertools.count()
        self._resolved_at = float("-inf")
        self._task: asyncio.Task | None = None
        self._sync_clients: dict[str, Any] = {}
        self._sync_lock = threading.Lock()
        self.failovers = 0  # calls made again on another address after theirs was unreachable
        self._update(source.resolve())

    # --- membership ---------------------------------------------------------------
    def _update(self, urls: list[str]) -> None:
        self._resolved_at = time.monotonic()
        if not urls:
            return
        with self._lock:
            before = list(self.members)
            gone = [m for url, m in self.members.items() if url not in urls]
            self.members = {url: self.members.get(url) or Member(url) for url in urls}
            self._retired += gone
        if before != urls:
            log.info("Triton addresses for %s: %s", self.url, ", ".join(urls))

    def addresses(self) -> list[str]:
        with self._lock:
            return list(self.members)

    def up(self) -> list[Member]:
        with self._lock:
            return [m for m in self.members.values() if not m.down]

    def _pick(self, tried: set[str]) -> Member | None:
        """Fewest calls in flight among the addresses not taken out; when all are out, try those
        too (one may be back before its probe says so)."""
        with self._lock:
            fresh = [m for m in self.members.values() if m.url not in tried]
        pool = [m for m in fresh if not m.down] or fresh
        if not pool:
            return None
        least = min(m.in_flight for m in pool)
        ties = [m for m in pool if m.in_flight == least]
        return ties[next(self._turn) % len(ties)]

    def _take_out(self, m: Member, why: Exception) -> None:
        if not m.down:
            log.warning("Triton %s taken out of %s: %s", m.url, self.url, why)
        m.down = True

    # --- calls --------------------------------------------------------------------
    async def run(self, model: str, call: Call[T]) -> T:
        self._start()
        tried: set[str] = set()
        last: Exception | None = None
        while True:
            m = self._pick(tried)
            if m is None and await self._resolve_now(tried):  # every known address failed: pods moved?
                m = self._pick(tried)
            if m is None:
                break
            tried.add(m.url)
            m.in_flight += 1
            try:
                result = await call_on(m.aio(), m.url, model, call)
                m.calls += 1
                return result
            except ModelNotReady as exc:  # still loading there, maybe loaded elsewhere
                last = exc
            except Unavailable as exc:
                if "DEADLINE_EXCEEDED" in str(exc):
                    raise
                self._take_out(m, exc)
                self.failovers += 1
                last = exc
            finally:
                m.in_flight -= 1
        raise last or Unavailable(f"no Triton address known for {self.url}", retry_after_s=1)

    async def _resolve_now(self, tried: set[str]) -> bool:
        """Look the name up again, at most once per ``RESOLVE_AGAIN_S``; True when it names an
        address not tried yet. Why: in a rollout every pod this worker knows may be gone before
        the next periodic lookup (``resolve_period_s``) while their replacements are Ready."""
        if self.source.fixed or time.monotonic() - self._resolved_at < RESOLVE_AGAIN_S:
            return False
        try:
            urls = await asyncio.to_thread(self.source.resolve)
        except Exception as exc:  # the name service failing is not the call's error
            log.warning("Triton address lookup for %s failed: %s", self.url, exc)
            self._resolved_at = time.monotonic()
            return False
        self._update(urls)
        return any(url not in tried for url in urls)

    async def model_ready(self, name: str) -> bool:
        async def one(m: Member) -> bool | None:
            try:
                return bool(await m.aio().is_model_ready(name, client_timeout=2.0))
            except Exception:
                return None

        answers = [a for a in await asyncio.gather(*(one(m) for m in self.up())) if a is not None]
        return bool(answers) and all(answers)

    def model_ready_sync(self, name: str) -> bool:
        """From the config thread (no event loop): resolves again itself when due."""
        if time.monotonic() - self._resolved_at >= self.resolve_period_s:
            self._update(self.source.resolve())
        answers = [a for m in self.up() if (a := model_ready_sync(self._sync_clients, self._sync_lock, m.url, name))
                   is not None]
        return bool(answers) and all(answers)

    # --- upkeep -------------------------------------------------------------------
    def _start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._upkeep())

    async def _upkeep(self) -> None:
        while True:
            try:
                if time.monotonic() - self._resolved_at >= self.resolve_period_s:
                    self._update(await asyncio.to_thread(self.source.resolve))
                await asyncio.gather(*(self._probe(m) for m in list(self.members.values()) if m.down))
                await self._close_retired()
            except Exception:  # upkeep must outlive any one failure
                log.exception("Triton address upkeep for %s failed", self.url)
            await asyncio.sleep(self.probe_period_s)

    async def _probe(self, m: Member) -> None:
        """Ask a taken-out server on a fresh channel; use it again once it answers."""
        fresh = grpc_aio.InferenceServerClient(m.url)
        try:
            live = await fresh.is_server_live(client_timeout=1.0)
        except Exception:
            live = False
        if not live:
            await fresh.close()
            return
        old, m.client, m.down = m.client, fresh, False
        log.info("Triton %s answers again: back in %s", m.url, self.url)
        if old is not None:
            await old.close()

    async def _close_retired(self) -> None:
        keep = []
        for m in self._retired:
            if m.in_flight:
                keep.append(m)
            elif m.client is not None:
                await m.client.close()
                m.client = None
        self._retired = keep

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for m in [*self.members.values(), *self._retired]:
            if m.client is not None:
                await m.client.close()
                m.client = None

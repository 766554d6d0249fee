"""An external engine's replicas: the endpoint's ``url`` option, one URL or several (comma-separated),
each of whose host names is resolved again every ``RESOLVE_PERIOD_S``.

Why resolve here: behind a Kubernetes headless Service (the chart's ``llm.replicas``) a name resolves to
one address per ready vLLM pod; a client that lets its HTTP library resolve it keeps its pooled
connections on whichever pod came first. Resolved here, every address is a replica of its own, and
pods that come and go join and leave the set. IPv4 addresses are used when the name has any, else
IPv6. A lookup that fails (or finds nothing) keeps the addresses known; a name never resolved is used
as it is. ``https`` URLs are used as they are (their certificate names the host, not an address).
"""
from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from typing import Callable
from urllib.parse import urlsplit, urlunsplit

from serving.dns import addresses
from serving.llm.routing.replicas import Member

log = logging.getLogger(__name__)

RESOLVE_PERIOD_S = 5.0


def lookup(host: str, port: int) -> list[str]:
    """The addresses ``host`` resolves to, IPv4 ones when there are any, sorted."""
    found = addresses(host, port, "the LLM engine's host")
    v4 = sorted(ip for family, ip in found if family == socket.AF_INET)
    return v4 or sorted(ip for family, ip in found if family == socket.AF_INET6)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class ExternalReplicas:
    """The members of one ``url`` setting (cached per setting by the engine)."""

    def __init__(self, setting: str, resolve: Callable[[str, int], list[str]] = lookup,
                 period_s: float = RESOLVE_PERIOD_S) -> None:
        self.setting = setting
        self.urls = [u.strip().rstrip("/") for u in setting.split(",") if u.strip()]
        self.resolve, self.period_s = resolve, period_s
        self._known: dict[str, list[str]] = {}   # url -> addresses last found
        self._at = float("-inf")
        self._lock = asyncio.Lock()

    def _named(self) -> list[tuple[str, str, int]]:
        """(url, host, port) of the URLs whose host is a name to resolve."""
        out = []
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme == "http" and parts.hostname and not _is_address(parts.hostname):
                out.append((url, parts.hostname, parts.port or 80))
        return out

    async def members(self) -> list[Member]:
        if time.monotonic() - self._at >= self.period_s:
            async with self._lock:
                if time.monotonic() - self._at >= self.period_s:
                    await self._refresh()
        out: list[Member] = []
        for url in self.urls:
            addresses = self._known.get(url)
            if not addresses:
                out.append(Member(url, url))
                continue
            parts = urlsplit(url)
            for address in addresses:
                host = f"[{address}]" if ":" in address else address
                netloc = f"{host}:{parts.port}" if parts.port else host
                out.append(Member(f"{parts.hostname}@{address}", urlunsplit(parts._replace(netloc=netloc))))
        return out

    async def _refresh(self) -> None:
        for url, host, port in self._named():
            found = await asyncio.to_thread(self.resolve, host, port)
            if found and found != self._known.get(url):
                log.info("LLM engine %s: %d address(es): %s", url, len(found), ", ".join(found))
            if found:
                self._known[url] = found
        self._at = time.monotonic()

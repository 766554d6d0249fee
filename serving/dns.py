"""Names resolved to every address behind them: a Kubernetes headless Service answers with one address
per ready pod, which is how the workers find Triton's pods (engines/triton_pool.py) and an external
LLM engine's replicas (llm/external.py) as they come and go."""
from __future__ import annotations

import logging
import socket

log = logging.getLogger(__name__)


def addresses(host: str, port: int, what: str) -> list[tuple[socket.AddressFamily, str]]:
    """(family, IP) of each address ``host`` resolves to, without repeats; none, with a warning naming
    ``what`` the name is for, when it does not resolve (a Service with no ready pod yet)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        log.warning("cannot resolve %s %s: %s", what, host, exc)
        return []
    return sorted({(i[0], i[4][0]) for i in infos})

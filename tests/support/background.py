"""A loop in a daemon thread for the span of a ``with`` block: the loads and probes a test runs while it changes
the system under them (a failover, a rollout), whose counts it reads afterwards."""
from __future__ import annotations

import threading


class Background:
    """``run`` in a daemon thread from ``__enter__``; ``__exit__`` sets ``stopping`` (``run`` checks it between
    iterations) and waits up to ``join_s`` for the loop to end."""

    join_s = 60.0

    def __init__(self, name: str | None = None) -> None:
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)

    def run(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self._thread.join(self.join_s)

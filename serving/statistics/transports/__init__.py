"""How batches of statistics leave a worker: ``embedded`` (HTTP POST to the statistics
service, no broker) or ``kafka``. Both carry the same envelope (see ``events.py``)."""
from __future__ import annotations

from typing import Protocol


class SendError(RuntimeError):
    """The batch did not go out; the recorder may retry it."""


class Sender(Protocol):
    """A transport for encoded batches; called only from the recorder's thread."""

    def send(self, payload: bytes, count: int) -> None:
        """Send one encoded batch of ``count`` events; raise :class:`SendError` to retry."""

    def failed_events(self) -> int:
        """Events lost after send() returned (asynchronous failures), cumulative."""

    def close(self, timeout: float) -> None:
        """Flush what is in flight, then release connections."""

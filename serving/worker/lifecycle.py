"""One request's life, the same for every path: a tensor request (dataplane.py) and a generation
(serving/llm/relay/generation.py) both run inside :func:`request_life`.

Why one: statuses, errors, statistics and client-key charges must mean the same on every protocol.
A user's code that refuses or times out becomes its ``ServingError`` (preprocess/base.py); a
``ServingError`` keeps its status; a client that goes away is ``CLIENT_CLOSED``; anything else is a
500. Whatever happened, the request's one statistics event is recorded when it ends, except when its
answer is a stream still being relayed: then the stream ends the life (:meth:`RequestLife.end`).
"""
from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from preprocess.base import PreprocessError
from serving.prediction_log.record import Captured
from serving.worker import request_ids
from serving.worker.errors import ServingError, user_code_error

CLIENT_CLOSED = 499  # the status a request's event gets when its client went away first


@dataclass
class RequestStats:
    """Timings and custom variables of one request, filled in as it goes."""

    endpoint: str
    t0: float = field(default_factory=time.perf_counter)
    version: int | None = None
    client: str | None = None  # the client key's name (never the key), when keys are required
    request_id: str | None = field(default_factory=request_ids.current)  # its X-Request-Id (request_ids.py)
    stages: dict[str, float] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # more event fields (an LLM request's usage, ttft_s)
    captured: Captured | None = None  # a request the prediction log keeps: its inputs and outputs (record.py)
    error: str | None = None          # what the client was told, when the request failed
    _mark: float = 0.0

    def __post_init__(self) -> None:
        self._mark = self.t0

    def stage(self, name: str) -> None:
        now = time.perf_counter()
        self.stages[name] = now - self._mark
        self._mark = now

    def collect(self, values: dict) -> None:
        if isinstance(values, dict):
            self.custom.update(values)


@dataclass
class RequestLife:
    stats: RequestStats
    record: Callable[[RequestStats, int], None]   # the data plane's: the one event, Triton's counters
    charge: Callable[[str | None, int], None]     # tokens against the client key's tokens per minute
    state: dict[str, Any] = field(default_factory=dict)  # the request's processors' state; its "event" joins the event
    status: int = 500
    handed_off: bool = False
    ended: bool = False

    def charge_tokens(self, tokens: int) -> None:
        self.charge(self.stats.client, tokens)

    def hand_off(self) -> None:
        """The answer is a stream: it ends the life when it ends (:meth:`end`), not the handler."""
        self.handed_off = True

    def end(self, status: int) -> None:
        if self.ended:
            return
        self.ended, self.status = True, status
        self.stats.extra.update(self.state.get("event") or {})  # an engine's own fields (torchserve: its batch)
        self.record(self.stats, status)


@contextmanager
def request_life(stats: RequestStats, record: Callable[[RequestStats, int], None],
                 charge: Callable[[str | None, int], None]) -> Iterator[RequestLife]:
    life = RequestLife(stats, record, charge)
    try:
        yield life
        life.status = 200
    except PreprocessError as exc:  # preprocess.py's deadline or refusal
        error = user_code_error(exc)
        life.status, stats.error = error.status, error.message
        raise error from None
    except ServingError as exc:
        life.status, stats.error = exc.status, exc.message
        raise
    except asyncio.CancelledError:  # the client went away; the engine's call was closed with it
        life.status, stats.error = CLIENT_CLOSED, "the client closed the connection"
        raise
    except Exception as exc:  # a bug: the front end answers 500 without details; the log keeps its name
        stats.error = f"internal error ({type(exc).__name__})"
        raise
    finally:
        if not life.handed_off:
            life.end(life.status)

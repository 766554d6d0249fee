"""Client keys on the data plane: who may call which endpoint, and how often.

Protocol-agnostic: every front end (``/serve``, ``/v2``, gRPC) calls :meth:`ClientKeys.check`
with the key it was sent (or None) and the endpoint asked for, and gets back the key's name
for the statistics, or one of the worker's errors (401, 403, 429 with ``Retry-After``) that
each protocol reports its own way. Nothing here asks the control plane: the keys (name,
sha256, endpoints, rate, burst, tokens per minute; never the key) come with each config snapshot, so a check
costs a sha256 and a dictionary lookup, and a revoked key stops with the next push.

The rate is a token bucket per key in each worker process (no state shared between
processes or replicas; docs/security.md says what that means for the rate a client sees).
Tokens per minute (LLM endpoints) are a second bucket that requests do not take from when they
start: the generation path charges each request's ``usage`` (prompt plus completion) when it
ends (:meth:`ClientKeys.charge`), and a request is refused only when the bucket is already
spent as it starts, so a limit crossed mid-stream ends the next request, never the running one.
Checks run only with ``SERVING_CLIENT_KEYS_REQUIRED=true``; otherwise :meth:`check` returns
None at once and nothing changes.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from serving.credentials import secret_sha256
from serving.worker.errors import Forbidden, ServingError, TooManyRequests, Unauthorized

log = logging.getLogger(__name__)

# refusal reasons, as the statistics label them
MISSING, INVALID, SCOPE, RATE, TOKENS = "missing_key", "invalid_key", "endpoint_scope", "rate", "tokens"
RefusalHook = Callable[[str, str, "str | None", int], None]  # endpoint, reason, key name, status


@dataclass(frozen=True)
class KeySpec:
    name: str
    endpoints: frozenset[str] | None  # None: every endpoint
    rate: float | None                # requests per second in this process; None: no limit
    burst: int
    tokens_per_minute: int | None = None  # LLM tokens (prompt + completion) in this process; None: no limit

    @classmethod
    def from_snapshot(cls, name: str, raw: dict[str, Any]) -> "KeySpec":
        endpoints = raw.get("endpoints")
        rate = float(raw["rate"]) if raw.get("rate") else None
        burst = int(raw.get("burst") or (max(1, math.ceil(rate)) if rate else 1))
        tpm = int(raw["tokens_per_minute"]) if raw.get("tokens_per_minute") else None
        return cls(name, None if endpoints is None else frozenset(endpoints), rate, burst, tpm)


class TokenBucket:
    """``burst`` requests at once, refilled at ``rate`` per second."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: int, now: float) -> None:
        self.rate, self.burst, self.tokens, self.stamp = rate, burst, float(burst), now

    def take(self, now: float) -> float:
        """0 when a request may go now (and it is counted), else the seconds until one may."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


class TokenBudget(TokenBucket):
    """A minute's tokens at once, refilled at a sixtieth of that per second; charged after the fact,
    so it may go below zero (a long answer borrows from the next minute)."""

    __slots__ = ()

    def __init__(self, per_minute: int, now: float) -> None:
        super().__init__(per_minute / 60.0, per_minute, now)

    def wait(self, now: float) -> float:
        """0 while at least one token is left, else the seconds until one is."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return 0.0 if self.tokens >= 1.0 else (1.0 - self.tokens) / self.rate

    def charge(self, tokens: int, now: float) -> None:
        self.wait(now)
        self.tokens -= tokens


def bearer(authorization: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header (HTTP) or metadata value (gRPC)."""
    if not authorization:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


class ClientKeys:
    def __init__(self, required: bool = False, on_refusal: RefusalHook | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.required = required
        self.on_refusal = on_refusal
        self.clock = clock
        self._by_hash: dict[str, KeySpec] = {}
        self._by_name: dict[str, KeySpec] = {}
        self._buckets: dict[str, TokenBucket] = {}
        self._budgets: dict[str, TokenBudget] = {}  # tokens per minute, by key name
        self._lock = threading.Lock()  # the gRPC server may check from its own thread

    def apply_snapshot(self, snapshot: dict[str, Any]) -> None:
        """Take the keys of a config snapshot; a key whose rate and burst did not change keeps its bucket."""
        by_hash: dict[str, KeySpec] = {}
        for name, raw in (snapshot.get("client_keys") or {}).items():
            try:
                by_hash[str(raw["sha256"])] = KeySpec.from_snapshot(name, raw)
            except (KeyError, TypeError, ValueError) as exc:  # one bad entry: that key is refused, not all
                log.warning("client key %s ignored: %s", name, exc)
        with self._lock:
            old = {spec.name: spec for spec in self._by_hash.values()}
            self._buckets = {spec.name: self._buckets[spec.name] for spec in by_hash.values()
                             if spec.name in self._buckets and old.get(spec.name) is not None
                             and (old[spec.name].rate, old[spec.name].burst) == (spec.rate, spec.burst)}
            self._budgets = {spec.name: self._budgets[spec.name] for spec in by_hash.values()
                             if spec.name in self._budgets and old.get(spec.name) is not None
                             and old[spec.name].tokens_per_minute == spec.tokens_per_minute}
            self._by_hash = by_hash
            self._by_name = {spec.name: spec for spec in by_hash.values()}

    def check(self, key: str | None, endpoint: str) -> str | None:
        """The key's name when it may call ``endpoint`` now; None when keys are not required.
        Raises Unauthorized (401), Forbidden (403) or TooManyRequests (429, Retry-After)."""
        if not self.required:
            return None
        spec = self._known(key, endpoint)
        if spec.endpoints is not None and endpoint not in spec.endpoints:
            allowed = ", ".join(sorted(spec.endpoints))
            self._refuse(endpoint, SCOPE, spec.name, Forbidden(
                f"client key {spec.name} may not call endpoint {endpoint!r} (it may call: {allowed})"))
        if spec.tokens_per_minute is not None:
            wait = self._spend(spec, 0)
            if wait > 0:
                self._refuse(endpoint, TOKENS, spec.name, TooManyRequests(
                    f"client key {spec.name} has spent its {spec.tokens_per_minute} tokens per minute "
                    f"(prompt + completion) on this worker process; retry in {wait:.1f} s",
                    retry_after_s=max(1, math.ceil(wait))))
        if spec.rate is not None:
            wait = self._take(spec)
            if wait > 0:
                self._refuse(endpoint, RATE, spec.name, TooManyRequests(
                    f"client key {spec.name} is over its rate of {spec.rate:g} requests/s "
                    f"(burst {spec.burst}) on this worker process; retry in {wait:.3f} s",
                    retry_after_s=max(1, math.ceil(wait))))
        return spec.name

    def charge(self, name: str | None, tokens: int) -> None:
        """Take a finished request's tokens from its key's budget (a key without one: nothing)."""
        if not self.required or name is None or tokens <= 0:
            return
        spec = self._by_name.get(name)
        if spec is not None and spec.tokens_per_minute is not None:
            self._spend(spec, tokens)

    def check_authorization(self, authorization: str | None, endpoint: str) -> str | None:
        """:meth:`check` from an ``Authorization`` header value."""
        if not self.required:
            return None
        return self.check(bearer(authorization), endpoint)

    def scope(self, authorization: str | None) -> frozenset[str] | None:
        """The endpoints the key may call, for listings (None: all, or keys not required); a missing or
        unknown key is refused as :meth:`check` refuses it."""
        if not self.required:
            return None
        return self._known(bearer(authorization), "").endpoints

    def _known(self, key: str | None, endpoint: str) -> KeySpec:
        if not key:
            self._refuse(endpoint, MISSING, None, Unauthorized(
                "a client key is required: send 'Authorization: Bearer <key>' (serving key create)"))
        spec = self._by_hash.get(secret_sha256(key))
        if spec is None:
            self._refuse(endpoint, INVALID, None, Unauthorized("invalid or revoked client key"))
        return spec

    def _take(self, spec: KeySpec) -> float:
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(spec.name)
            if bucket is None:
                bucket = self._buckets[spec.name] = TokenBucket(spec.rate, spec.burst, now)
            return bucket.take(now)

    def _spend(self, spec: KeySpec, tokens: int) -> float:
        """Charge ``tokens`` (0: only look); the seconds until the budget has a token again."""
        now = self.clock()
        with self._lock:
            budget = self._budgets.get(spec.name)
            if budget is None:
                budget = self._budgets[spec.name] = TokenBudget(spec.tokens_per_minute or 1, now)
            if tokens:
                budget.charge(tokens, now)
            return budget.wait(now)

    def _refuse(self, endpoint: str, reason: str, name: str | None, error: ServingError) -> None:
        if self.on_refusal is not None:
            try:
                self.on_refusal(endpoint, reason, name, error.status)
            except Exception:  # statistics must never change the answer
                log.exception("refusal not recorded")
        raise error

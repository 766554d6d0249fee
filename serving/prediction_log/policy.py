"""An endpoint's prediction-log settings as the control plane pushes them, and which requests they keep.

Why the sampling decision hashes the request id rather than drawing a random number: a request's
shadow copy is logged beside its live answer, and both must be kept or neither; a client's own
``X-Request-Id`` retried at another worker process is kept there too. The hash is BLAKE2b, so the
kept share is the asked one for any ids, a client's own included.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

FIELDS = ("inputs", "outputs", "error", "client", "usage")  # what a record may keep besides its identity
MAX_INPUT_BYTES = 65_536  # inputs (and outputs) past this are summarized: size, digest, a preview
MAX_PATTERNS = 32
REDACTED = "[REDACTED]"


@dataclass(frozen=True)
class LogPolicy:
    sample: float = 0.0  # percent of requests kept
    fields: frozenset[str] = frozenset(FIELDS)
    redact: tuple[re.Pattern[str], ...] = field(default=())
    max_bytes: int = MAX_INPUT_BYTES

    @property
    def on(self) -> bool:
        return self.sample > 0

    def keeps(self, request_id: str | None) -> bool:
        """Whether this request is logged: the first 8 bytes of its id's BLAKE2b hash, as a fraction,
        below the sample share."""
        if self.sample >= 100:
            return True
        if self.sample <= 0 or not request_id:
            return False
        digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2 ** 64 * 100 < self.sample

    def scrub(self, text: str) -> str:
        for pattern in self.redact:
            text = pattern.sub(REDACTED, text)
        return text


def check_patterns(patterns: Iterable[str]) -> list[str]:
    """The patterns, each compiled once to refuse a bad one where it is set (the control plane)."""
    out = list(patterns)
    if len(out) > MAX_PATTERNS:
        raise ValueError(f"at most {MAX_PATTERNS} redaction patterns")
    for p in out:
        try:
            re.compile(p)
        except re.error as exc:
            raise ValueError(f"redaction pattern {p!r} is not a regular expression: {exc}") from None
    return out


def check_fields(fields: Iterable[str]) -> list[str]:
    out = list(dict.fromkeys(fields))
    unknown = [f for f in out if f not in FIELDS]
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}; a record may keep {', '.join(FIELDS)}")
    return out


def from_snapshot(raw: Any) -> LogPolicy | None:
    """The endpoint's ``prediction_log`` of a snapshot (None or sample 0: not logged). The control plane
    checked it; a worker given something else logs nothing rather than failing the endpoint."""
    if not isinstance(raw, dict) or not raw.get("sample"):
        return None
    try:
        return LogPolicy(sample=min(100.0, max(0.0, float(raw["sample"]))),
                         fields=frozenset(check_fields(raw.get("fields") or FIELDS)),
                         redact=tuple(re.compile(p) for p in check_patterns(raw.get("redact") or ())),
                         max_bytes=int(raw.get("max_bytes") or MAX_INPUT_BYTES))
    except (TypeError, ValueError):
        return None

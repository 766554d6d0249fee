"""W3C Trace Context's ``traceparent`` header: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``.

Why refuse a malformed one rather than ignore it (as the W3C text lets a tracer do): a client that sends
the header wants its trace continued, and a silently new trace loses the link it asked for; a 400 naming
the header tells it at once. An absent header starts a new trace.
"""
from __future__ import annotations

import re

from serving.errors import BadRequest

HEADER = "traceparent"
_FORMAT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


class BadTraceparent(BadRequest):
    pass


def check(value: str) -> str:
    """The header as given when it is a usable trace context; else :class:`BadTraceparent` saying why."""
    found = _FORMAT.match(value.strip())
    if found is None:
        raise BadTraceparent(f"traceparent {value[:100]!r} is not a W3C trace context: "
                             "version-traceid-parentid-flags, e.g. 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
    version, trace_id, parent_id, _, rest = found.groups()
    if version == "ff" or (version == "00" and rest):
        raise BadTraceparent(f"traceparent version {version!r} is not one this server reads")
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        raise BadTraceparent("traceparent has an all-zero trace id or parent id, which W3C forbids")
    return value.strip()

"""The routing policies an LLM endpoint may pick (``--aux-config routing=NAME``), by name.

Here, below both of their users, so that no import points upward: the registry checks an endpoint's
option against these names (serving/llm/checks.py), and the worker builds the policy a name refers to
(serving/llm/routing/policies/, where each policy is a module of its own). The references are strings,
so naming a policy here imports nothing of the worker. Adding a policy is its module and one entry here.
"""
from __future__ import annotations

POLICIES: dict[str, str] = {
    "least-loaded": "serving.llm.routing.policies.least_loaded:LeastLoaded",
    "session": "serving.llm.routing.policies.session:Session",
    "prefix": "serving.llm.routing.policies.prefix:Prefix",
    "round-robin": "serving.llm.routing.policies.round_robin:RoundRobin",
}
DEFAULT = "least-loaded"


def names() -> tuple[str, ...]:
    return tuple(POLICIES)

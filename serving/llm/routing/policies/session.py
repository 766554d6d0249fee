"""``session``: one conversation, one replica. The key is the ``X-Session-Id`` header, else OpenAI's
``user`` field; rendezvous hashing (hashing.py) maps it to a replica, the same in every worker, and a
replica added takes over about 1/N of the sessions (the others stay where they are). Should that replica
fail or leave, its sessions go to their next choice. A request with neither key goes to the least loaded.
Stickiness is strict: a busy replica keeps its sessions (``prefix`` spills instead).
"""
from __future__ import annotations

from typing import Sequence

from serving.llm.routing.policies.base import Replica, RouteHint, Rotation, by_load
from serving.llm.routing.policies.hashing import rendezvous


class Session:
    def __init__(self) -> None:
        self.rotation = Rotation()

    def order(self, replicas: Sequence[Replica], hint: RouteHint) -> list[Replica]:
        if not hint.session:
            return by_load(replicas, self.rotation)
        return rendezvous(replicas, hint.session.encode())

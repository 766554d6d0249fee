"""``round-robin``: each request to the next replica in turn, whatever their load (this process's turn:
workers rotate apart from one another)."""
from __future__ import annotations

from typing import Sequence

from serving.llm.routing.policies.base import Replica, RouteHint, Rotation


class RoundRobin:
    def __init__(self) -> None:
        self.rotation = Rotation()

    def order(self, replicas: Sequence[Replica], hint: RouteHint) -> list[Replica]:
        return self.rotation.rotate(replicas)

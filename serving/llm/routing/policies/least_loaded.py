"""``least-loaded`` (the default): the replica with the fewest requests running and waiting.

Its count is the engine's own (``vllm:num_requests_running`` + ``vllm:num_requests_waiting``, read
about once a second, so it includes every worker's requests) corrected by what this process sent or
finished since the read (:attr:`Replica.load`). Ties rotate.
"""
from __future__ import annotations

from typing import Sequence

from serving.llm.routing.policies.base import Replica, RouteHint, Rotation, by_load


class LeastLoaded:
    def __init__(self) -> None:
        self.rotation = Rotation()

    def order(self, replicas: Sequence[Replica], hint: RouteHint) -> list[Replica]:
        return by_load(replicas, self.rotation)

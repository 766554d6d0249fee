"""The user's own ``Preprocess.process`` is the engine (ClearML's ``custom`` and ``custom_async``).

The model, if the endpoint has one, is whatever the user's ``load`` made of its file;
an endpoint may have no model at all (a pipeline that calls other endpoints). The two
names differ only in the ``send_request`` the user code gets: blocking for ``custom``
(ClearML's pipeline example calls it from its own thread pool), a coroutine for
``custom_async``.
"""
from __future__ import annotations

from typing import Any, Iterable

from preprocess.base import Collect
from serving.worker.runtime import Target


class CustomEngine:
    kind = "python"
    runs_user_process = True  # run() is processor.process: the data plane may run the three steps in one hop

    def __init__(self, asynchronous: bool = False) -> None:
        self.asynchronous = asynchronous

    def prepare(self, target: Target) -> None:
        """The user's ``load`` reads the model file; nothing to load here."""

    def retain(self, targets: Iterable[Target]) -> None:
        pass

    async def run(self, target: Target, processor: Any, data: Any, state: dict, collect: Collect) -> Any:
        return await processor.process(data, state, collect)

    async def ready(self, target: Target) -> bool:
        return True

    async def close(self) -> None:
        pass


def create(settings: Any, artifact_path: Any) -> CustomEngine:
    return CustomEngine()


def create_async(settings: Any, artifact_path: Any) -> CustomEngine:
    return CustomEngine(asynchronous=True)

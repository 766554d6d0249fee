"""Control-plane routes of progressive rollouts (``registry/rollouts.py``)."""
from __future__ import annotations

from fastapi import APIRouter, Request

from registry import schemas
from registry.auth import principal_of
from registry.rollouts import Rollouts


def actor(request: Request) -> str:
    """Who asked (the token's name), recorded in the rollout's history."""
    principal = principal_of(request)
    return principal.name if principal is not None else "anonymous"


def rollout_router(rollouts: Rollouts) -> APIRouter:
    router = APIRouter(tags=["rollouts"])

    @router.post("/rollouts", status_code=201)
    def start(req: schemas.RolloutStart, request: Request):
        return rollouts.start(req, actor(request))

    @router.get("/rollouts")
    def list_rollouts(endpoint: str | None = None):
        return rollouts.list(endpoint)

    @router.post("/rollouts/{endpoint}/abort")
    def abort(endpoint: str, request: Request):
        return rollouts.abort(endpoint, actor(request))

    @router.post("/rollouts/{endpoint}/pause")
    def pause(endpoint: str, request: Request):
        """The rollout keeps its current share and takes no step nor decision until resumed."""
        return rollouts.pause(endpoint, actor(request))

    @router.post("/rollouts/{endpoint}/resume")
    def resume(endpoint: str, request: Request):
        """A paused rollout goes on at its step, judged on a fresh window of a whole interval."""
        return rollouts.resume(endpoint, actor(request))

    return router

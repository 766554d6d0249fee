"""Control-plane routes of progressive rollouts (``registry/rollouts.py``)."""
from __future__ import annotations

from fastapi import APIRouter, Request

from registry import schemas
from registry.rollouts import Rollouts


def actor(request: Request) -> str:
    """Who asked, for the audit log: the token's name once authentication has put it on the request."""
    return getattr(request.state, "actor", None) or "anonymous"


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

    return router

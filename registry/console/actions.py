"""The console's actions: each one a POST carrying the session's CSRF token, made through the API.

What cannot be undone (promote, roll back, abort a rollout, revoke a key or token) first shows a
confirmation page (pausing a rollout can be undone by resuming it: no confirmation); its "Confirm" button posts the same form again with ``confirm=yes``. The API
answers for itself: its validation errors and role refusals are shown as it words them, with its
status, and its audit log records the signed-in user.
"""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from registry.console.api_client import ApiError
from registry.console.sessions import Session
from registry.console.web import Console, api_path, back_to, endpoint_page

Form = dict[str, str]


def _number(form: Form, field: str) -> float:
    try:
        return float(form.get(field, ""))
    except ValueError:
        raise HTTPException(422, f"{field}: a number is needed, not {form.get(field, '')!r}") from None


def _weights(form: Form) -> dict[str, float]:
    return {k.removeprefix("weight_"): _number(form, k) for k in form if k.startswith("weight_")}


def _steps(form: Form) -> list[float]:
    try:
        return [float(s.strip().rstrip("%")) for s in form.get("steps", "").split(",") if s.strip()]
    except ValueError:
        raise HTTPException(422, f"steps: percents separated by commas, e.g. 10,50,100; not {form.get('steps')!r}") from None


def _optional(form: Form, field: str) -> float | None:
    return _number(form, field) if form.get(field, "").strip() else None


Call = Callable[[Console, Session, Form], Awaitable[Any]]


async def _set_weights(c: Console, s: Session, f: Form):
    return await c.api.call(s.token, "PUT", f"/endpoints/{api_path(f['endpoint'])}/weights",
                            json={"weights": _weights(f)})


async def _promote(c: Console, s: Session, f: Form):
    return await c.api.call(s.token, "POST", f"/endpoints/{api_path(f['endpoint'])}/promote")


async def _rollback(c: Console, s: Session, f: Form):
    return await c.api.call(s.token, "POST", f"/endpoints/{api_path(f['endpoint'])}/rollback")


async def _shadow_on(c: Console, s: Session, f: Form):
    model, _, version = f.get("model", "").partition(":")
    body = {"endpoint": f["endpoint"], "model": model, "shadow": _number(f, "percent"),
            "version": int(version) if version.isdigit() else None}
    return await c.api.call(s.token, "POST", "/endpoints", json=body)


async def _shadow_off(c: Console, s: Session, f: Form):
    return await c.api.call(s.token, "DELETE", f"/endpoints/{api_path(f['endpoint'])}/shadow")


async def _rollout_start(c: Console, s: Session, f: Form):
    model, _, version = f.get("model", "").partition(":")
    body = {"endpoint": f["endpoint"], "model": model, "version": int(version) if version.isdigit() else None,
            "steps": _steps(f), "interval_s": _number(f, "interval_s"),
            "max_error_rate": _optional(f, "max_error_rate"), "max_p99_ms": _optional(f, "max_p99_ms"),
            "max_accuracy_drop": _optional(f, "max_accuracy_drop"),
            "min_labelled": int(_optional(f, "min_labelled") or 1)}
    return await c.api.call(s.token, "POST", "/rollouts", json=body)


async def _prediction_log(c: Console, s: Session, f: Form):
    fields = [x.strip() for x in f.get("fields", "").split(",") if x.strip()]
    body = {"sample": _number(f, "sample"), "fields": fields or None,
            "redact": [line for line in f.get("redact", "").splitlines() if line.strip()]}
    return await c.api.call(s.token, "PUT", f"/endpoints/{api_path(f['endpoint'])}/prediction-log", json=body)


async def _rollout_abort(c: Console, s: Session, f: Form):
    return await c.api.call(s.token, "POST", f"/rollouts/{api_path(f['endpoint'])}/abort")


async def _rollout_pause(c: Console, s: Session, f: Form):
    return await c.api.call(s.token, "POST", f"/rollouts/{api_path(f['endpoint'])}/pause")


async def _rollout_resume(c: Console, s: Session, f: Form):
    return await c.api.call(s.token, "POST", f"/rollouts/{api_path(f['endpoint'])}/resume")


# action -> (what it does, the API call, whether it asks to confirm first)
ACTIONS: dict[str, tuple[str, Call, bool]] = {
    "weights": ("set the traffic split", _set_weights, False),
    "promote": ("promote the canary to all traffic (the other live versions leave the endpoint)", _promote, True),
    "rollback": ("roll back to the previous configuration", _rollback, True),
    "shadow-on": ("copy a share of requests to a shadow version", _shadow_on, False),
    "shadow-off": ("stop shadowing", _shadow_off, False),
    "rollout-start": ("start a gated rollout", _rollout_start, False),
    "prediction-log": ("set what the prediction log keeps", _prediction_log, False),
    "rollout-pause": ("pause the rollout (it keeps its share; no step and no decision until resumed)",
                      _rollout_pause, False),
    "rollout-resume": ("resume the rollout (judged after a fresh interval)", _rollout_resume, False),
    "rollout-abort": ("abort the rollout (the candidate's share goes back to 0)", _rollout_abort, True),
}


def routes(console: Console) -> APIRouter:
    router = APIRouter()

    @router.post("/act/{action}", response_class=HTMLResponse)
    async def act(request: Request, action: str):
        session, form = await console.acting_session(request)
        if action not in ACTIONS:
            raise HTTPException(404, f"no console action {action!r}; one of {', '.join(ACTIONS)}")
        if not form.get("endpoint"):
            raise HTTPException(422, "endpoint: which endpoint the action is for")
        words, call, irreversible = ACTIONS[action]
        if irreversible and form.get("confirm") != "yes":
            return console.render(request, "confirm.html", session, action=action, words=words, form=form,
                                  back=endpoint_page(form["endpoint"]), page="overview")
        try:
            await call(console, session, form)
        except ApiError as exc:
            console.flash(session, f"{action} refused ({exc.status}): {exc.detail}", ok=False)
        else:
            console.flash(session, f"{form['endpoint']}: done, {words}")
        return back_to(endpoint_page(form["endpoint"]))

    @router.post("/keys/create", response_class=HTMLResponse)
    async def create_key(request: Request):
        session, form = await console.acting_session(request)
        kind = form.get("kind", "key")
        name = form.get("name", "").strip()
        try:
            if kind == "token":
                made = await console.api.call(session.token, "POST", "/tokens",
                                              json={"name": name, "role": form.get("role", "viewer")})
                secret = made["token"]
            else:
                endpoints = [e.strip() for e in form.get("endpoints", "").split(",") if e.strip()] or None
                made = await console.api.call(session.token, "POST", "/client-keys",
                                              json={"name": name, "endpoints": endpoints})
                secret = made["key"]
        except ApiError as exc:
            console.flash(session, f"{kind} {name} refused ({exc.status}): {exc.detail}", ok=False)
            return back_to("/console/keys")
        return console.render(request, "secret.html", session, kind=kind, name=name, secret=secret, page="keys")

    @router.post("/keys/revoke", response_class=HTMLResponse)
    async def revoke_key(request: Request):
        session, form = await console.acting_session(request)
        kind, name = form.get("kind", "key"), form.get("name", "")
        if form.get("confirm") != "yes":
            return console.render(request, "confirm.html", session, action=None, target="/console/keys/revoke",
                                  words=f"revoke {kind} {name}: whoever holds it is refused from now on",
                                  form=form, back="/console/keys", page="keys")
        path = f"/tokens/{api_path(name)}" if kind == "token" else f"/client-keys/{api_path(name)}"
        try:
            await console.api.call(session.token, "DELETE", path)
        except ApiError as exc:
            console.flash(session, f"revoke {kind} {name} refused ({exc.status}): {exc.detail}", ok=False)
        else:
            console.flash(session, f"revoked {kind} {name}")
        return back_to("/console/keys")

    return router

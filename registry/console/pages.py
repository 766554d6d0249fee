"""The console's pages: each reads the API with the signed-in user's token and renders a template."""
from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from registry.console.api_client import ApiError
from registry.console.charts import line_chart
from registry.console.stats import Figures
from registry.console.web import Console, api_path
from registry.rollout_metrics import quantile
from serving.llm.naming import LLM_ENGINES

WINDOWS = {"15m": 900.0, "1h": 3600.0}
CHARTS = [("rate", "Requests", "req/s"), ("p50_ms", "Latency p50", "ms"), ("p99_ms", "Latency p99", "ms"),
          ("errors", "Errors", "per interval"), ("drift", "Drift (largest PSI)", "PSI"),
          ("tokens_per_s", "LLM tokens", "tokens/s"), ("ttft_p99_ms", "LLM TTFT p99", "ms"), ("itl_p99_ms", "LLM inter-token latency p99", "ms")]


def version_rows(console: Console, endpoint: dict, figures: dict) -> list[dict[str, Any]]:
    """Each target of an endpoint with its live figures (the statistics service's, read now)."""
    rows = []
    for t in endpoint["targets"]:
        key = (endpoint["name"], str(t["version"]))
        f: Figures = figures.get(key, Figures())
        rows.append({**t, "figures": f, "rate": console.stats.rate(key),
                     "p50_ms": _ms(f.percentile(0.5)), "p99_ms": _ms(f.percentile(0.99)),
                     "ttft_p99_ms": _ms(quantile(0.99, f.ttft)), "tokens_per_s": _tokens_rate(console, key)})
    return rows


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _tokens_rate(console: Console, key) -> float | None:
    points = console.stats.series(key, 60.0)
    values = [p.tokens_per_s for p in points if p.tokens_per_s is not None]
    return sum(values) / len(values) if values else None


def routes(console: Console) -> APIRouter:
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse)
    async def overview(request: Request):
        session = console.session(request)
        endpoints, readiness = await asyncio.gather(
            console.api.call(session.token, "GET", "/endpoints"),
            console.api.call(session.token, "GET", "/readiness"))
        rollouts = await console.api.call(session.token, "GET", "/rollouts")
        figures = await console.stats.now()
        running = {r["endpoint"]: r for r in rollouts if r["state"] in ("running", "paused")}
        rows = [{"ep": ep, "versions": version_rows(console, ep, figures), "rollout": running.get(ep["name"])}
                for ep in endpoints]
        return console.render(request, "overview.html", session, rows=rows, workers=readiness,
                              stats_error=console.stats.error, page="overview")

    @router.get("/endpoint", response_class=HTMLResponse)
    async def endpoint(request: Request, name: str, window: str = "15m"):
        session = console.session(request)
        if window not in WINDOWS:
            window = "15m"
        try:
            ep = await console.api.call(session.token, "GET", f"/endpoints/{api_path(name)}")
        except ApiError as exc:
            return console.render(request, "error.html", session, status=exc.status, error=exc.detail, page="overview")
        rollouts = await console.api.call(session.token, "GET", "/rollouts", params={"endpoint": name})
        changes = [e for e in await console.api.call(session.token, "GET", "/audit", params={"limit": 500})
                   if e["target"] == name or e["target"].startswith(name + "/")][:10]
        figures = await console.stats.now()
        versions = version_rows(console, ep, figures)
        end = console.stats.clock()
        start = console.stats.since(WINDOWS[window])
        series = {f"v{t['version']} ({t['role']})": console.stats.series((name, str(t["version"])), WINDOWS[window])
                  for t in ep["targets"]}
        charts = [line_chart(title, unit, {label: [(p.at, getattr(p, field)) for p in pts]
                                           for label, pts in series.items()}, start, end)
                  for field, title, unit in CHARTS
                  if not field.startswith(("tokens", "ttft", "itl")) or ep["engine"] in LLM_ENGINES]
        return console.render(request, "endpoint.html", session, ep=ep, versions=versions, rollouts=rollouts,
                              changes=changes, charts=charts, window=window, windows=list(WINDOWS),
                              stats_error=console.stats.error, page="overview")

    @router.get("/models", response_class=HTMLResponse)
    async def models(request: Request):
        session = console.session(request)
        found, endpoints = await asyncio.gather(console.api.call(session.token, "GET", "/models"),
                                                console.api.call(session.token, "GET", "/endpoints"))
        used: dict[tuple[str, int], list[str]] = {}
        for ep in endpoints:
            for t in ep["targets"]:
                used.setdefault((t["model"], t["version"]), []).append(ep["name"])
        return console.render(request, "models.html", session, models=found, used=used, page="models")

    @router.get("/workers", response_class=HTMLResponse)
    async def workers(request: Request):
        session = console.session(request)
        reports = await console.api.call(session.token, "GET", "/readiness")
        revision = console.broadcaster.snapshot.get("revision")
        return console.render(request, "workers.html", session, reports=reports, revision=revision, page="workers")

    @router.get("/audit", response_class=HTMLResponse)
    async def audit(request: Request, actor: str = "", action: str = "", target: str = ""):
        session = console.session(request)
        entries = await console.api.call(session.token, "GET", "/audit", params={"limit": 1000})
        wanted = {"actor": actor.strip(), "action": action.strip(), "target": target.strip()}
        shown = [e for e in entries if all(v.lower() in str(e[k]).lower() for k, v in wanted.items() if v)][:200]
        return console.render(request, "audit.html", session, entries=shown, wanted=wanted, page="audit")

    @router.get("/keys", response_class=HTMLResponse)
    async def keys(request: Request):
        session = console.session(request)
        if not session.is_admin():
            return console.render(request, "error.html", session, status=403, page="keys",
                                  error=f"token {session.name} has role {session.role}; keys and tokens need role admin")
        client_keys, tokens = await asyncio.gather(console.api.call(session.token, "GET", "/client-keys"),
                                                   console.api.call(session.token, "GET", "/tokens"))
        return console.render(request, "keys.html", session, client_keys=client_keys, tokens=tokens, page="keys")

    return router

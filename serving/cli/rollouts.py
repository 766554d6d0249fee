"""`serving rollout ...`: progressive rollouts gated on the candidate's live metrics."""
from __future__ import annotations

import re
from typing import Optional

import typer

from serving.cli.models import parse_model_ref
from serving.cli.output import console, show

app = typer.Typer(help="Move a version's traffic step by step; roll back by itself when a gate fails.",
                  no_args_is_help=True)

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_interval(text: str) -> float:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise typer.BadParameter(f"interval {text!r} must look like 60s, 2m, 500ms or a number of seconds")
    return float(match.group(1)) * _UNITS[match.group(2) or "s"]


def parse_rate(text: Optional[str]) -> Optional[float]:
    """``1%`` or ``0.01``."""
    if text is None:
        return None
    try:
        value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    except ValueError:
        raise typer.BadParameter(f"{text!r} must be a share such as 1% or 0.01")
    if not 0 <= value <= 1:
        raise typer.BadParameter(f"{text!r} must be between 0% and 100%")
    return value


@app.command()
def start(
    ctx: typer.Context,
    endpoint: str = typer.Option(..., "--endpoint"),
    model: str = typer.Option(..., "--model", help="NAME:VERSION, the candidate (latest when no version)"),
    steps: str = typer.Option("5,25,50,100", help="percent of traffic at each step, ending at 100"),
    interval: str = typer.Option("60s", help="how long each step lasts: 60s, 2m, 500ms"),
    max_error_rate: Optional[str] = typer.Option(None, help="e.g. 1%: the candidate's non-2xx share per step"),
    max_p99_ms: Optional[float] = typer.Option(None, help="the candidate's p99 latency per step"),
    max_drift: Optional[float] = typer.Option(None, help="the largest PSI of the candidate's variables"),
    max_ttft_p99_ms: Optional[float] = typer.Option(None, help="LLM endpoints: the candidate's time to first "
                                                               "token p99 per step (docs/llm-rollouts.md)"),
    max_itl_p99_ms: Optional[float] = typer.Option(None, help="LLM endpoints: the candidate's inter-token "
                                                              "latency p99 per step"),
    min_requests: int = typer.Option(1, help="requests the candidate needs in a step before it is judged"),
    max_accuracy_drop: Optional[str] = typer.Option(None, help="e.g. 2%: live accuracy from feedback the candidate "
                                                               "may lose against the stable version "
                                                               "(docs/prediction-log.md)"),
    min_labelled: int = typer.Option(1, help="labelled requests each version needs before accuracy is judged"),
) -> None:
    """Start a rollout: the candidate takes each step's share in turn, then is promoted."""
    name, version = parse_model_ref(model)
    try:
        percents = [float(s.strip().rstrip("%")) for s in steps.split(",") if s.strip()]
    except ValueError:
        raise typer.BadParameter(f"--steps {steps!r} must look like 5,25,50,100")
    body = {"endpoint": endpoint, "model": name, "version": version, "steps": percents,
            "interval_s": parse_interval(interval), "max_error_rate": parse_rate(max_error_rate),
            "max_p99_ms": max_p99_ms, "max_drift": max_drift, "min_requests": min_requests,
            "max_ttft_p99_ms": max_ttft_p99_ms, "max_itl_p99_ms": max_itl_p99_ms,
            "max_accuracy_drop": parse_rate(max_accuracy_drop), "min_labelled": min_labelled}
    r = ctx.obj.post("/rollouts", json=body)
    console.print(f"rollout of {r['model']}:{r['version']} on [bold]{endpoint}[/bold]: step 1 of {len(r['steps'])} "
                  f"at {r['weight']:g}%, next check in {r['interval_s']:g} s")


@app.command()
def status(ctx: typer.Context, endpoint: Optional[str] = typer.Option(None, "--endpoint"),
           json_: bool = typer.Option(False, "--json"), history: bool = typer.Option(False, "--history")) -> None:
    """Rollouts, newest first: state, step, share, and why they stopped."""
    rows = ctx.obj.get("/rollouts", params={"endpoint": endpoint} if endpoint else None)
    if json_:
        show(rows, [], True)
        return
    table = [{**r, "candidate": f"{r['model']}:{r['version']}", "step": f"{r['step'] + 1}/{len(r['steps'])}"}
             for r in rows]
    show(table, ["id", "endpoint", "candidate", "state", "step", "weight", "reason"], False, "rollouts")
    if history and rows:
        events = [{"at": e["at"], "step": e["step"] + 1, "weight": e["weight"], "event": e["event"],
                   "observed": e.get("observed", "")} for e in rows[0]["history"]]
        show(events, ["at", "step", "weight", "event", "observed"], False, f"rollout {rows[0]['id']} history")


@app.command()
def abort(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint")) -> None:
    """Stop the running rollout: the stable version takes all traffic again."""
    r = ctx.obj.post(f"/rollouts/{endpoint}/abort")
    console.print(f"rollout {r['id']} on {endpoint}: {r['state']} ({r['reason']})")


@app.command()
def pause(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint")) -> None:
    """Hold the running rollout at its step: no step is taken and no gate judged until `resume`."""
    r = ctx.obj.post(f"/rollouts/{endpoint}/pause")
    console.print(f"rollout {r['id']} on {endpoint}: {r['state']} at step {r['step'] + 1} of {len(r['steps'])} "
                  f"({r['weight']:g}%)")


@app.command()
def resume(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint")) -> None:
    """Go on with a paused rollout at its step; it is judged after a fresh interval."""
    r = ctx.obj.post(f"/rollouts/{endpoint}/resume")
    console.print(f"rollout {r['id']} on {endpoint}: {r['state']} at step {r['step'] + 1} of {len(r['steps'])} "
                  f"({r['weight']:g}%), next check in {r['interval_s']:g} s")

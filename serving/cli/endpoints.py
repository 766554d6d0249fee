"""`serving endpoint|canary|metrics ...`: endpoints, traffic splits and statistics variables."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from serving.cli.client import ControlPlane
from serving.cli.output import console, show
from serving.cli.readiness import state_text

endpoint_app = typer.Typer(help="Public endpoints and their routes.", no_args_is_help=True)
canary_app = typer.Typer(help="Split an endpoint's traffic between versions.", no_args_is_help=True)
metrics_app = typer.Typer(help="Per-endpoint statistics variables (ClearML Serving flags).", no_args_is_help=True)


def _routes(ep: dict) -> str:
    return ", ".join(f"{t['model']}:{t['version']}={t['weight']:g}% ({t['role']})" for t in ep["targets"])


def _engine(ep: dict) -> str:
    """The engine kind, and for LLM endpoints which engine serves each version (endpoints deploying one
    version with equal options share an engine: serving/llm/naming.py)."""
    served = [(t["version"], t["served_by"]) for t in ep["targets"] if t.get("served_by")]
    if not served:
        return ep["engine"]
    return ep["engine"] + "".join(f"\n v{v}: {s['url'] or s['engine']} ({s['options']})" for v, s in served)


def _print(ep: dict) -> None:
    console.print(f"endpoint [bold]{ep['name']}[/bold]: {_routes(ep)}")


@endpoint_app.command("list")
def endpoint_list(ctx: typer.Context, json_: bool = typer.Option(False, "--json")) -> None:
    """List endpoints with their weighted routes."""
    eps = ctx.obj.get("/endpoints")
    if json_:
        show(eps, [], True)
        return
    rows = [{**e, "engine": _engine(e), "routes": _routes(e), "preprocess": e["preprocess"].get("kind", "none"),
             "state": state_text(e.get("readiness"))} for e in eps]
    show(rows, ["name", "engine", "preprocess", "routes", "state"], False, "endpoints")


@endpoint_app.command("remove")
def endpoint_remove(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint")) -> None:
    ctx.obj.request("DELETE", f"/endpoints/{endpoint}")
    console.print(f"removed endpoint {endpoint}")


def parse_weights(text: str) -> dict[str, float]:
    weights = {}
    for part in text.split(","):
        version, sep, weight = part.partition("=")
        if not sep or not version.strip().isdigit():
            raise typer.BadParameter(f"'{part}' must look like VERSION=PERCENT, e.g. 1=90,2=10")
        weights[version.strip()] = float(weight.rstrip("%"))
    return weights


@canary_app.command("set")
def canary_set(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint"),
               weights: str = typer.Option(..., help="VERSION=PERCENT,... adding up to 100")) -> None:
    """Set the traffic split of an endpoint's versions."""
    _print(ctx.obj.request("PUT", f"/endpoints/{endpoint}/weights", json={"weights": parse_weights(weights)}))


@canary_app.command("promote")
def canary_promote(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint")) -> None:
    """The canary takes all traffic and becomes the stable version."""
    _print(ctx.obj.post(f"/endpoints/{endpoint}/promote"))


@canary_app.command("rollback")
def canary_rollback(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint")) -> None:
    """The stable version takes all traffic again; the canary is dropped."""
    _print(ctx.obj.post(f"/endpoints/{endpoint}/rollback"))


@canary_app.command("shadow")
def canary_shadow(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint"),
                  model: Optional[str] = typer.Option(None, "--model", help="NAME or NAME:VERSION"),
                  percent: str = typer.Option("100%", "--percent", help="share of requests copied, e.g. 30%"),
                  off: bool = typer.Option(False, "--off", help="stop shadowing")) -> None:
    """Copy a share of requests to a version: compared with the live answer, never returned (docs/rollouts.md)."""
    from serving.cli.models import shadow_body

    if off == bool(model):
        raise typer.BadParameter("give --model NAME[:VERSION] (with --percent), or --off")
    if off:
        _print(ctx.obj.request("DELETE", f"/endpoints/{endpoint}/shadow"))
    else:
        _print(ctx.obj.post("/endpoints", json=shadow_body(endpoint, model, percent)))


def _split(spec: str) -> tuple[str, str]:
    name, sep, rest = spec.partition("=")
    if not sep or not name or not rest:
        raise typer.BadParameter(f"'{spec}' must look like NAME=A,B,C")
    return name, rest


def scalar_buckets(name: str, rest: str) -> list[float]:
    """The histogram bounds of ``--variable-scalar NAME=REST``: listed (``0,0.1,0.5``) or, as ClearML
    Serving's help states it, ``MIN/MAX/COUNT``: COUNT equal-width buckets from MIN to MAX, so
    ``0/1/5`` is the same histogram as ``0,0.2,0.4,0.6,0.8,1``."""
    if "/" not in rest:
        try:
            return [float(b) for b in rest.split(",")]
        except ValueError:
            raise typer.BadParameter(f"buckets of {name} must be numbers: {rest}") from None
    try:
        low, high, count = (float(p) for p in rest.split("/"))
    except ValueError:
        raise typer.BadParameter(f"buckets of {name} must be MIN/MAX/COUNT, three numbers: {rest}") from None
    if not (low < high and count >= 1 and count.is_integer()):
        raise typer.BadParameter(f"buckets of {name}: MIN/MAX/COUNT needs MIN < MAX and a whole COUNT >= 1: {rest}")
    count = int(count)
    # a weighted mean, not low + i * step: 0/1/5 gives 0.6, not 0.6000000000000001
    return [(low * (count - i) + high * i) / count for i in range(count + 1)]


def _metrics_endpoint(ref: str) -> str:
    """ClearML names the endpoint with a version or a prefix (``model/1``, ``model/*``); variables
    here belong to the endpoint, whatever version served the request."""
    from serving.cli.clearml_flags import endpoint_of

    return endpoint_of(ref)[0]


@metrics_app.command("add")
def metrics_add(
    ctx: typer.Context,
    endpoint: str = typer.Option(..., "--endpoint", callback=_metrics_endpoint),
    variable_scalar: list[str] = typer.Option([], help="NAME=B1,B2,... histogram bounds, or NAME=MIN/MAX/COUNT: COUNT equal buckets"),
    variable_enum: list[str] = typer.Option([], help="NAME=V1,V2,... allowed values"),
    variable_value: list[str] = typer.Option([], help="NAME: last value as a gauge"),
    log_freq: Optional[float] = typer.Option(None, help="fraction of requests recorded, 0..1"),
) -> None:
    """Declare statistics variables for an endpoint (as ClearML Serving's `metrics add`)."""
    cp: ControlPlane = ctx.obj
    bodies = []
    for spec in variable_scalar:
        name, rest = _split(spec)
        bodies.append({"name": name, "kind": "scalar", "buckets": scalar_buckets(name, rest)})
    for spec in variable_enum:
        name, rest = _split(spec)
        bodies.append({"name": name, "kind": "enum", "values": rest.split(",")})
    bodies += [{"name": name, "kind": "value"} for name in variable_value]
    for body in bodies:
        cp.post(f"/endpoints/{endpoint}/metrics", json=body)
    if log_freq is not None:
        cp.request("PUT", f"/endpoints/{endpoint}/log-freq", json={"log_freq": log_freq})
    console.print(f"{endpoint}: {len(bodies)} variable(s) declared" + (f", log-freq {log_freq}" if log_freq is not None else ""))


@metrics_app.command("list")
def metrics_list(ctx: typer.Context, endpoint: Optional[str] = typer.Option(None, "--endpoint",
                                                                             help="default: every endpoint"),
                 json_: bool = typer.Option(False, "--json")) -> None:
    eps = [ctx.obj.get(f"/endpoints/{_metrics_endpoint(endpoint)}")] if endpoint else ctx.obj.get("/endpoints")
    rows = [{"endpoint": ep["name"], "log_freq": ep["log_freq"], **m} for ep in eps for m in ep["metrics"]]
    show(rows, ["endpoint", "name", "kind", "buckets", "values", "log_freq"], json_, "statistics variables")


@metrics_app.command("remove")
def metrics_remove(ctx: typer.Context, endpoint: str = typer.Option(..., "--endpoint", callback=_metrics_endpoint),
                   variable: list[str] = typer.Option(..., help="repeatable")) -> None:
    for name in variable:
        ctx.obj.request("DELETE", f"/endpoints/{endpoint}/metrics/{name}")
    console.print(f"{endpoint}: removed {', '.join(variable)}")


reference_app = typer.Typer(help="Drift reference distributions, kept by the statistics service.",
                            no_args_is_help=True)
metrics_app.add_typer(reference_app, name="reference")
_STATS_URL = typer.Option(None, "--statistics-url", envvar="SERVING_STATISTICS_URL",
                          help="statistics service (default from SERVING_STATISTICS_HOST/_PORT)")
_VERSION = typer.Option("*", "--version", help="model version, or * for every version without its own")


def _statistics_call(method: str, url: Optional[str], *args: object) -> dict:
    from rich.markup import escape

    from serving.statistics.client import StatisticsClient, StatisticsClientError

    client = StatisticsClient(url)
    try:
        return getattr(client, method)(*args)
    except StatisticsClientError as exc:
        console.print(f"[red]{escape(str(exc))}[/red]")
        raise typer.Exit(1)


@reference_app.command("upload")
def reference_upload(
    endpoint: str = typer.Option(..., "--endpoint"),
    variable: str = typer.Option(..., "--variable", help="a declared variable of the endpoint"),
    version: str = _VERSION,
    file: Optional[Path] = typer.Option(None, "--file", exists=True, dir_okay=False,
                                        help="JSON list / {\"values\": [...]}, or one value per line"),
    values: Optional[str] = typer.Option(None, "--values", help="comma-separated values instead of --file"),
    statistics_url: Optional[str] = _STATS_URL,
) -> None:
    """Upload the distribution drift is measured against (instead of the first N values after a deploy)."""
    from serving.statistics.client import read_values

    if (file is None) == (values is None):
        raise typer.BadParameter("give exactly one of --file or --values")
    try:
        data = read_values(file) if file is not None else [v.strip() for v in values.split(",") if v.strip()]
    except ValueError as exc:
        raise typer.BadParameter(str(exc))
    res = _statistics_call("upload_reference", statistics_url, endpoint, version, variable, data)
    console.print(f"{endpoint} v{version} {variable} ({res['kind']}): reference of {res['size']} values uploaded")


@reference_app.command("show")
def reference_show(endpoint: str = typer.Option(..., "--endpoint"), variable: str = typer.Option(..., "--variable"),
                   version: str = _VERSION, statistics_url: Optional[str] = _STATS_URL,
                   json_: bool = typer.Option(False, "--json")) -> None:
    """Show the stored reference (uploaded, or learned from the first values after a deploy)."""
    ref = _statistics_call("get_reference", statistics_url, endpoint, version, variable)
    if json_:
        show([ref], [], True)
        return
    origin = "uploaded" if ref["uploaded"] else "learned"
    console.print(f"{endpoint} v{version} {variable} ({ref['kind']}): {len(ref['values'])} values, {origin}")


@reference_app.command("reset")
def reference_reset(endpoint: str = typer.Option(..., "--endpoint"), variable: str = typer.Option(..., "--variable"),
                    version: str = _VERSION, statistics_url: Optional[str] = _STATS_URL) -> None:
    """Forget the reference: the next values the version reports form a new one."""
    _statistics_call("reset_reference", statistics_url, endpoint, version, variable)
    console.print(f"{endpoint} v{version} {variable}: reference reset")


def _sample(text: str) -> float:
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise typer.BadParameter(f"'{text}' must look like 10%", param_hint="--sample") from None
    if not 0 <= value <= 100:
        raise typer.BadParameter("the share must be between 0% and 100%", param_hint="--sample")
    return value


@endpoint_app.command("log")
def endpoint_log(
    ctx: typer.Context,
    endpoint: str = typer.Option(..., "--endpoint"),
    sample: Optional[str] = typer.Option(None, help="share of requests logged, e.g. 10% or 100%"),
    off: bool = typer.Option(False, "--off", help="log nothing more of this endpoint"),
    field: list[str] = typer.Option([], help="kept besides the request's identity (repeatable): inputs, outputs, "
                                           "error, client, usage; default: all"),
    redact: list[str] = typer.Option([], help="a regular expression whose matches are stored as [REDACTED] (repeatable)"),
    max_bytes: int = typer.Option(65_536, help="inputs or outputs longer than this (as JSON) are summarized"),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Keep what an endpoint's requests asked and were answered: the prediction log (docs/prediction-log.md)."""
    if off == (sample is not None):
        raise typer.BadParameter("give either --sample 10% or --off", param_hint="--sample")
    body = {"sample": 0.0 if off else _sample(sample or ""), "fields": field or None, "redact": redact,
            "max_bytes": max_bytes}
    out = ctx.obj.request("PUT", f"/endpoints/{endpoint}/prediction-log", json=body)
    if json_:
        show(out, [], True)
        return
    settings = out["prediction_log"]
    if settings is None:
        console.print(f"{endpoint}: prediction log off")
        return
    redacted = f", redacting {len(settings['redact'])} pattern(s)" if settings["redact"] else ""
    console.print(f"{endpoint}: logging {settings['sample']:g}% of requests ({', '.join(settings['fields'])})"
                  f"{redacted}")

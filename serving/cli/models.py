"""`serving model ...`: upload, list, remove model versions and put them behind endpoints."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from serving.cli.client import ControlPlane
from serving.cli.output import console, show

# Triton's batcher only groups requests of one shape: a few length buckets let different lengths share a batch.
BATCH_PAD_MULTIPLE = 16

app = typer.Typer(help="Model versions in the registry, and deploying them to endpoints.", no_args_is_help=True)


def plane(ctx: typer.Context) -> ControlPlane:
    return ctx.obj


@app.command()
def upload(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", help="model name; each upload adds the next version"),
    path: Path = typer.Option(..., "--path", exists=True, dir_okay=False, help="model file (ONNX)"),
    framework: str = typer.Option("onnx", help="onnx | custom"),
    tag: list[str] = typer.Option([], "--tag", help="repeatable"),
    metadata: Optional[str] = typer.Option(None, help="JSON object stored with the version"),
    optimize: Optional[str] = typer.Option(None, help="fusion | int8: onnxruntime transformer fusions, + int8 weights"),
    num_heads: int = typer.Option(0, help="attention heads, for --optimize (0: detect)"),
    hidden_size: int = typer.Option(0, help="hidden size, for --optimize (0: detect)"),
) -> None:
    """Upload a model file (with a progress bar) and register it as a new version."""
    cp = plane(ctx)
    try:
        meta = json.loads(metadata) if metadata else {}
    except ValueError as exc:
        raise typer.BadParameter(f"--metadata is not valid JSON: {exc}")
    if optimize:
        path, report = _optimized(path, optimize, num_heads, hidden_size)
        meta.update(report)
    sha = cp.upload_file(path)
    m = cp.post("/models", json={"name": name, "artifact": sha, "framework": framework, "tags": tag, "metadata": meta})
    console.print(f"registered [bold]{m['name']}:{m['version']}[/bold] ({m['size']} bytes, sha256 {m['sha256'][:12]})")


def _optimized(path: Path, mode: str, num_heads: int, hidden_size: int) -> tuple[Path, dict]:
    from serving.optimize import optimize

    if mode not in ("fusion", "int8"):
        raise typer.BadParameter(f"--optimize must be fusion or int8, not {mode!r}")
    with console.status(f"optimizing ({mode}) and checking agreement on a sample"):
        report = optimize(path, mode, num_heads=num_heads, hidden_size=hidden_size)
    console.print(f"{mode}: predicted label agrees with the original on {report.label_agreement:.1%} of "
                  f"{report.samples} samples (max |logit diff| {report.max_abs_logit_diff:.2e}); "
                  f"{report.size_before / 1e6:.1f} MB -> {report.size_after / 1e6:.1f} MB")
    return report.path, report.as_metadata()


@app.command("list")
def list_(ctx: typer.Context, name: Optional[str] = typer.Option(None), json_: bool = typer.Option(False, "--json")) -> None:
    """List model versions."""
    rows = plane(ctx).get("/models", params={"name": name} if name else None)
    show(rows, ["name", "version", "framework", "size", "sha256", "tags", "created_at"], json_, "models")


@app.command()
def remove(ctx: typer.Context, name: str = typer.Option(..., "--name"), version: Optional[int] = typer.Option(None)) -> None:
    """Remove a model version (or all versions); refused while an endpoint routes to it."""
    out = plane(ctx).request("DELETE", f"/models/{name}", params={"version": version} if version else None)
    console.print(f"removed {out['removed']} version(s) of {name}")


def parse_model_ref(ref: str) -> tuple[str, int | None]:
    name, _, version = ref.partition(":")
    if version and not version.isdigit():
        raise typer.BadParameter(f"version in '{ref}' must be a number, as in NAME:3")
    return name, int(version) if version else None


def parse_percent(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise typer.BadParameter(f"canary share '{text}' must look like 10%")
    if not 0 < value < 100:
        raise typer.BadParameter("canary share must be between 0% and 100%")
    return value


@app.command()
def add(
    ctx: typer.Context,
    endpoint: str = typer.Option(..., "--endpoint", help="public endpoint name (/serve/ENDPOINT)"),
    model: str = typer.Option(..., "--model", help="NAME or NAME:VERSION (latest when omitted)"),
    engine: str = typer.Option("triton", help="triton | onnxruntime | custom"),
    tokenizer: Optional[Path] = typer.Option(None, file_okay=False, exists=True, help="Hugging Face tokenizer dir"),
    preprocess: Optional[Path] = typer.Option(None, dir_okay=False, exists=True, help="preprocess.py (ClearML interface)"),
    labels: Optional[str] = typer.Option(None, help="comma-separated class labels for the tokenizer postprocess"),
    max_length: int = typer.Option(128, help="tokenizer truncation length"),
    pad_to_multiple_of: Optional[int] = typer.Option(
        None, help="round padded lengths up to a multiple, so Triton can batch requests of different lengths "
                   "(default: 16 behind Triton's dynamic batcher, else 0: the longest text)"),
    canary: Optional[str] = typer.Option(None, help="e.g. 10%: this version takes that share, the current one the rest"),
    max_batch_size: int = typer.Option(32),
    max_queue_delay_us: int = typer.Option(2000, help="Triton dynamic batcher queue delay"),
    preferred_batch_size: list[int] = typer.Option([], help="repeatable"),
    instances: int = typer.Option(1, help="Triton model instances"),
) -> None:
    """Deploy a model version behind an endpoint, or as a canary of it."""
    if tokenizer and preprocess:
        raise typer.BadParameter("give --tokenizer or --preprocess, not both")
    cp = plane(ctx)
    name, version = parse_model_ref(model)
    body = {
        "endpoint": endpoint, "model": name, "version": version, "engine": engine,
        "canary": parse_percent(canary),
        "batching": {"max_batch_size": max_batch_size, "max_queue_delay_us": max_queue_delay_us,
                     "preferred_batch_sizes": preferred_batch_size, "instances": instances},
    }
    if tokenizer:
        if pad_to_multiple_of is None:  # padding only pays where requests are batched together
            pad_to_multiple_of = BATCH_PAD_MULTIPLE if engine == "triton" and max_batch_size > 0 else 0
        if pad_to_multiple_of and max_length % pad_to_multiple_of:
            raise typer.BadParameter(f"--max-length {max_length} must be a multiple of --pad-to-multiple-of")
        options = {"max_length": max_length, "pad_to_multiple_of": pad_to_multiple_of,
                   **({"labels": labels.split(",")} if labels else {})}
        body["preprocess"] = {"kind": "tokenizer", "artifact": cp.upload_dir(tokenizer), "options": options}
    elif preprocess:
        body["preprocess"] = {"kind": "user", "artifact": cp.upload_file(preprocess), "options": {}}
    ep = cp.post("/endpoints", json=body)
    routes = ", ".join(f"{t['model']}:{t['version']} {t['weight']:g}%" for t in ep["targets"])
    console.print(f"endpoint [bold]{ep['name']}[/bold] ({ep['engine']}): {routes}")

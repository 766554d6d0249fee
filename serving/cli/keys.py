"""`serving key ...`: data-plane client keys (admin role), checked by workers with keys required."""
from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

from serving.cli.output import show

console = Console(stderr=True)
key_app = typer.Typer(help="Client keys of the data plane (/serve, /v2, OpenAI; admin role).", no_args_is_help=True)


@key_app.command("create")
def key_create(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", help="who holds it (the statistics count requests by this name)"),
    endpoints: Optional[str] = typer.Option(None, "--endpoints", help="comma-separated endpoints it may call "
                                                                       "[default: all]"),
    rate: Optional[float] = typer.Option(None, "--rate", help="requests per second, per worker process "
                                                             "[default: no limit]"),
    burst: Optional[int] = typer.Option(None, "--burst", help="requests at once above the rate "
                                                             "[default: one second's worth]"),
    tokens_per_minute: Optional[int] = typer.Option(
        None, "--tokens-per-minute", help="tokens per minute (LLM: prompt + completion; encoders: the texts'), per worker process; "
                                          "a request is refused (429) once they are spent [default: no limit]"),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Create a key; it is printed once (on stdout) and only its sha256 is stored."""
    scope = [e.strip() for e in endpoints.split(",") if e.strip()] if endpoints is not None else None
    row = ctx.obj.post("/client-keys", json={"name": name, "endpoints": scope, "rate": rate, "burst": burst,
                                                   "tokens_per_minute": tokens_per_minute})
    if json_:
        show([row], [], as_json=True)
        return
    where = ", ".join(row["endpoints"]) if row["endpoints"] else "every endpoint"
    limit = f"{row['rate']:g} req/s, burst {row['burst']}" if row["rate"] else "no rate limit"
    if row.get("tokens_per_minute"):
        limit += f", {row['tokens_per_minute']} tokens/min"
    console.print(f"created client key [bold]{row['name']}[/bold] ({where}; {limit}); it is shown only now:")
    print(row["key"])


@key_app.command("list")
def key_list(ctx: typer.Context, json_: bool = typer.Option(False, "--json")) -> None:
    """Keys (never their values): endpoints, rate, burst, tokens per minute, creation, revoked."""
    show(ctx.obj.get("/client-keys"), ["name", "endpoints", "rate", "burst", "tokens_per_minute", "created_at",
                                       "revoked"], json_)


@key_app.command("revoke")
def key_revoke(ctx: typer.Context, name: str = typer.Option(..., "--name")) -> None:
    """Revoke a key: workers refuse it (401) once they have the next config push."""
    ctx.obj.request("DELETE", f"/client-keys/{name}")
    console.print(f"revoked client key {name}")

"""`serving token ...`, `serving login`, `serving audit`: credentials and who did what."""
from __future__ import annotations

from typing import Optional

import typer
from rich.console import Console

from serving.cli.output import show

console = Console()
token_app = typer.Typer(help="API tokens of the control plane (admin role).", no_args_is_help=True)


@token_app.command("create")
def token_create(
    ctx: typer.Context,
    name: str = typer.Option(..., "--name", help="who holds it (shown in the audit log)"),
    role: str = typer.Option(..., "--role", help="admin | deployer | viewer | worker"),
    upload_quota: Optional[int] = typer.Option(None, "--upload-quota-bytes",
                                               help="most bytes this token may upload in all"),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Create a token; it is printed once and only its sha256 is stored."""
    body = {"name": name, "role": role, "upload_quota_bytes": upload_quota}
    row = ctx.obj.post("/tokens", json=body)
    if json_:
        show([row], [], as_json=True)
        return
    console.print(f"created token [bold]{row['name']}[/bold] (role {row['role']}); it is shown only now:")
    print(row["token"])


@token_app.command("list")
def token_list(ctx: typer.Context, json_: bool = typer.Option(False, "--json")) -> None:
    """Tokens (never their values): role, creation, last use, revoked, upload quota."""
    show(ctx.obj.get("/tokens"), ["name", "role", "created_at", "last_used_at", "revoked",
                                  "upload_quota_bytes", "uploaded_bytes"], json_)


@token_app.command("revoke")
def token_revoke(ctx: typer.Context, name: str = typer.Option(..., "--name")) -> None:
    """Revoke a token at once (its next request answers 401)."""
    ctx.obj.request("DELETE", f"/tokens/{name}")
    console.print(f"revoked token {name}")


def login(
    token: str = typer.Option(..., "--token", prompt=True, hide_input=True,
                              help="the token (prompted for when omitted, so it stays out of `ps` and history)"),
    control_plane: Optional[str] = typer.Option(None, "--control-plane", help="control plane URL to remember"),
    check: bool = typer.Option(True, "--check/--no-check", help="ask the control plane who the token is"),
) -> None:
    """Save a token (and the control plane URL) for the CLI, mode 0600."""
    from serving.cli.client import ControlPlane
    from serving.credentials import save_credentials

    if check:
        me = ControlPlane(control_plane or "http://127.0.0.1:8080", token=token, token_source="--token").get(
            "/auth/whoami")
        console.print(f"token {me['name']}, role {me['role']}")
    path = save_credentials(token.strip(), control_plane)
    console.print(f"saved to {path} (mode 0600)")


def audit(
    ctx: typer.Context,
    limit: int = typer.Option(50, "--limit", help="newest entries to show"),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """The audit log, newest first: when, who (token name), what, on which object."""
    rows = ctx.obj.get("/audit", params={"limit": limit})
    if not json_:
        for r in rows:
            r["status"] = (r.get("detail") or {}).get("status")
    show(rows, ["at", "actor", "action", "target", "status", "detail"], json_)

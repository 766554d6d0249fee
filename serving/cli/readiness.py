"""After a deploy: wait until the new routes answer on every worker process, or say the switch is pending.

Workers keep an endpoint's previous routes answering until its new versions are ready where
they run (serving/worker/gate.py) and report that to the control plane; this reads
``GET /endpoints/{name}/status?wait=S`` (registry/readiness.py), a long poll.
"""
from __future__ import annotations

import time
from urllib.parse import quote

import typer

from serving.cli.client import ControlPlane
from serving.cli.output import console

LONG_POLL_S = 20.0


def state_text(readiness: dict | None) -> str:
    """One word (and why) for `serving endpoint list` and `serving status`."""
    if not readiness:
        return "unknown"
    state = readiness["state"]
    if state == "pending" and readiness.get("workers"):
        state = f"pending ({readiness['ready_workers']}/{readiness['workers']} processes)"
    if state == "failed" and readiness.get("error"):
        state = f"failed: {readiness['error']}"
    return state


def status_path(endpoint: str, wait_s: float) -> str:
    return f"/endpoints/{quote(endpoint, safe='')}/status?wait={wait_s:g}"


def wait_ready(cp: ControlPlane, endpoint: str, timeout_s: float) -> dict:
    """The endpoint's status once it is ready or failed, or the last one seen at ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(0.0, deadline - time.monotonic())
        status = cp.get(status_path(endpoint, min(LONG_POLL_S, left)), timeout=LONG_POLL_S + 10)
        if status["state"] in ("ready", "failed") or left <= 0:
            return status


def after_deploy(cp: ControlPlane, endpoint: str, wait: bool, timeout_s: float) -> None:
    """``--wait``: block until the version answers everywhere (exit 0), or fails to load / times out
    (exit 1). Without it, say that the switch happens when the new version is ready."""
    if not wait:
        console.print("the workers switch to the new routes once the new version is ready on each of them "
                      "(the previous routes answer meanwhile); `serving endpoint list` shows when, "
                      "`--wait` waits for it")
        return
    t0 = time.monotonic()
    status = wait_ready(cp, endpoint, timeout_s)
    took = time.monotonic() - t0
    if status["state"] == "ready":
        console.print(f"[green]ready[/green]: {endpoint} answers with the new routes on all "
                      f"{len(status['workers'])} worker process(es) after {took:.1f}s")
        return
    if status["state"] == "failed":
        console.print(f"[red]failed[/red]: {status['error']} (the previous routes keep answering)")
    elif status["state"] == "unknown":
        console.print(f"[red]no worker process reported in {took:.0f}s[/red]: is a worker running and following "
                      f"this control plane?")
    else:
        waiting = sorted({w for line in status["workers"] for w in line.get("waiting", [])})
        console.print(f"[red]not ready after {took:.0f}s[/red]: still waiting for {', '.join(waiting) or '?'} "
                      f"(the previous routes keep answering)")
    raise typer.Exit(1)

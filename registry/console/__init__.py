"""The web console at ``/console``: the control plane's own pages over its API (docs/console.md).

Mounted as a sub-application so that its pages answer to a session cookie instead of the API's
bearer token check (which covers every route of the API itself); everything it reads or changes
goes through that API with the signed-in user's token (api_client.py).
"""
from __future__ import annotations

from fastapi import FastAPI

from serving.settings import ControlPlaneSettings


def mount(app: FastAPI, settings: ControlPlaneSettings) -> None:
    """Serve the console under ``/console`` of ``app`` (the control plane's API)."""
    from registry.console.app import create_console

    app.mount("/console", create_console(app, settings))

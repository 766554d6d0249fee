"""The console's way to the control plane's API: in-process, with the signed-in user's own token.

Every read and every action of the console is an ordinary API request (ASGI, no socket), so it
passes the same token check, role rules, validation and audit log as the CLI's: a viewer's
promote is refused by the API itself, and the audit log names the user who clicked.
"""
from __future__ import annotations

from typing import Any

import httpx


class ApiError(Exception):
    """The API refused: its status and its own words (``detail``)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def _detail(resp: httpx.Response) -> str:
    try:
        doc = resp.json()
    except ValueError:
        return resp.text[:500]
    detail = doc.get("detail", doc) if isinstance(doc, dict) else doc
    if isinstance(detail, list):  # validation errors: "where: what" each
        return "; ".join(f"{'.'.join(str(p) for p in e.get('loc', [])[1:])}: {e.get('msg')}"
                         if isinstance(e, dict) else str(e) for e in detail)
    return str(detail)


class Api:
    def __init__(self, app: Any) -> None:
        self.transport = httpx.ASGITransport(app=app)

    async def call(self, token: str, method: str, path: str, **kw: Any) -> Any:
        async with httpx.AsyncClient(transport=self.transport, base_url="http://control-plane",
                                     headers={"Authorization": f"Bearer {token}"}, timeout=30.0) as client:
            resp = await client.request(method, path, **kw)
        if resp.status_code >= 400:
            raise ApiError(resp.status_code, _detail(resp))
        return resp.json() if resp.content else None

"""HTTP client of the statistics service's reference routes, for ``serving metrics reference``.

It lives here rather than in the CLI so the route layout stays next to the service
that defines it (``service.py``); the CLI only parses flags and prints.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from serving.settings import StatisticsSettings
from serving.statistics.recorder import statistics_url
from serving.statistics.references import ANY_VERSION


class StatisticsClientError(RuntimeError):
    """The service was unreachable or refused the request; the message says which."""


def default_url() -> str:
    return statistics_url(StatisticsSettings())


def read_values(path: Path) -> list[Any]:
    """A reference from a file: JSON (a list, or ``{"values": [...]}``) or one value per line."""
    text = path.read_text()
    if path.suffix.lower() == ".json":
        doc = json.loads(text)
        values = doc.get("values") if isinstance(doc, dict) else doc
        if not isinstance(values, list):
            raise ValueError(f"{path}: expected a JSON list or {{\"values\": [...]}}")
        return values
    return [line.strip() for line in text.splitlines() if line.strip()]


class StatisticsClient:
    def __init__(self, url: str | None = None, timeout: float = 30.0, token: str | None = None) -> None:
        """``token`` None: the CLI's (SERVING_TOKEN, `serving login`, the local admin token file)."""
        self.url = (url or default_url()).rstrip("/")
        self.timeout = timeout
        if token is None:
            from serving.credentials import cli_token, read_credentials

            token, _ = cli_token(read_credentials().get("control_plane") or StatisticsSettings().control_plane_url)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def _path(self, endpoint: str, version: str, variable: str) -> str:
        parts = (endpoint, version or ANY_VERSION, variable)
        return "/references/" + "/".join(quote(p, safe="*") for p in parts)

    def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            resp = httpx.request(method, self.url + path, timeout=self.timeout, headers=self.headers, **kw)
        except httpx.HTTPError as exc:
            raise StatisticsClientError(f"cannot reach the statistics service at {self.url}: {exc}") from exc
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            raise StatisticsClientError(f"error {resp.status_code}: {detail}")
        return resp.json()

    def upload_reference(self, endpoint: str, version: str, variable: str, values: list[Any]) -> dict[str, Any]:
        return self._request("PUT", self._path(endpoint, version, variable), json={"values": values})

    def get_reference(self, endpoint: str, version: str, variable: str) -> dict[str, Any]:
        return self._request("GET", self._path(endpoint, version, variable))

    def reset_reference(self, endpoint: str, version: str, variable: str) -> dict[str, Any]:
        return self._request("DELETE", self._path(endpoint, version, variable))

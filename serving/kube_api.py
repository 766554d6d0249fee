"""The Kubernetes API as the control plane's pods reach it: their service account's token and CA.

Why a few lines of httpx and not the official client: the control plane reads and writes a handful
of objects (the front-proxy CA for its metrics API, the LLM engines' Deployments and Services), and the
official client's generated models would be most of the image's Python. The token file is read on every
call: a projected token is rotated in place by the kubelet.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT_S = 10.0


class KubeError(RuntimeError):
    """The API answered with an error, or could not be reached."""


@dataclass(frozen=True)
class InCluster:
    base_url: str
    token_file: Path
    ca_file: Path
    namespace: str

    @classmethod
    def from_pod(cls, root: Path = SERVICE_ACCOUNT) -> "InCluster | None":
        """The pod's API access, or None outside a pod (or a pod whose token is not mounted)."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if not host or not port or not (root / "token").is_file():
            return None
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", root / "token", root / "ca.crt", (root / "namespace").read_text().strip())

    def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        return self.request("GET", path, params=params)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                params: dict[str, str] | None = None, missing_ok: bool = False) -> dict[str, Any]:
        """One call; the object answered. ``missing_ok``: a 404 answers ``{}`` (deleting what is gone)."""
        headers = {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}
        try:
            with httpx.Client(base_url=self.base_url, verify=str(self.ca_file), timeout=TIMEOUT_S) as client:
                if method == "PATCH":  # a JSON merge patch: the fields named, null deletes one
                    r = client.request(method, path, params=params, content=json.dumps(body),
                                       headers={**headers, "Content-Type": "application/merge-patch+json"})
                else:
                    r = client.request(method, path, headers=headers, json=body, params=params)
        except httpx.HTTPError as exc:
            raise KubeError(f"{method} {path}: {exc}") from None
        if missing_ok and r.status_code == 404:
            return {}
        if r.status_code not in (200, 201, 202):
            raise KubeError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        return r.json()

"""HTTP client of the control plane for the CLI: one place that turns failures into clear messages."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import httpx
import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

err = Console(stderr=True)


class ControlPlane:
    def __init__(self, url: str, token: str | None = None, token_source: str = "") -> None:
        """``token``: None finds one (SERVING_TOKEN, `serving login`, a local control plane's
        $SERVING_HOME/tokens/admin); see serving/credentials.py."""
        from serving.credentials import cli_token

        self.url = url.rstrip("/")
        if token is None:
            token, token_source = cli_token(self.url)
        self.token, self.token_source = token, token_source

    def request(self, method: str, path: str, **kw: Any) -> Any:
        from serving.credentials import auth_headers

        headers = {**auth_headers(self.token), **kw.pop("headers", {})}
        try:
            resp = httpx.request(method, self.url + path, timeout=kw.pop("timeout", 30.0), headers=headers, **kw)
        except httpx.HTTPError as exc:
            err.print(f"[red]cannot reach the control plane at {self.url}: {exc}[/red]")
            raise typer.Exit(2)
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text
            err.print(f"[red]error {resp.status_code}: {_readable(detail)}[/red]")
            if resp.status_code == 401:
                err.print(f"token used: {self.token_source or 'none'}; set SERVING_TOKEN or run "
                          "`serving login --token T`")
            raise typer.Exit(1)
        return resp.json()

    def get(self, path: str, **kw: Any) -> Any:
        return self.request("GET", path, **kw)

    def post(self, path: str, **kw: Any) -> Any:
        return self.request("POST", path, **kw)

    def upload_file(self, path: Path, label: str | None = None) -> str:
        """Stream a file to the artifact store with a progress bar; returns its sha256."""
        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    yield chunk

        return self.upload_stream(path.stat().st_size, chunks(), label or f"uploading {path.name}")

    def upload_stream(self, size: int, chunks: Iterator[bytes], label: str) -> str:
        """Stream ``size`` bytes to the artifact store with a progress bar; returns their sha256."""
        with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                      TransferSpeedColumn(), console=err) as progress:
            task = progress.add_task(label, total=size)

            def counted() -> Iterator[bytes]:
                for chunk in chunks:
                    progress.update(task, advance=len(chunk))
                    yield chunk

            return self.post("/artifacts", content=counted(), timeout=600.0)["sha256"]

    def upload_dir(self, path: Path) -> str:
        """Tokenizer directories travel as one deterministic tar.gz artifact."""
        from preprocess.loader import pack_directory

        return self.post("/artifacts", content=pack_directory(path), timeout=600.0)["sha256"]


def _readable(detail: Any) -> str:
    """FastAPI validation errors are lists of dicts; show them as `field: message`."""
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail)
    return str(detail)

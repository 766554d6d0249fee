"""Where the platform's tokens live on a machine, and how each process finds its own.

* Bootstrap token files, ``$SERVING_HOME/tokens/admin`` and ``$SERVING_HOME/tokens/worker``
  (mode 0600, directory 0700): a control plane started without ``SERVING_ADMIN_TOKEN`` /
  ``SERVING_WORKER_TOKEN`` creates them on first start (``serving up``, ``serving demo``, tests),
  so processes of one user on one machine find them with no extra step.
* Workers, the embedded Triton and the statistics service present the worker token:
  ``SERVING_WORKER_TOKEN``, else the worker token file under ``SERVING_HOME``.
* The CLI presents ``SERVING_TOKEN``, else the token saved by ``serving login`` (``credentials``
  file, see :func:`credentials_path`), else, for a control plane on this machine only, the local
  admin token file.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from urllib.parse import urlparse

TOKEN_PREFIX = "srv_"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def secret_sha256(secret: str) -> str:
    """How the platform stores and compares every secret it issues (API tokens, client keys)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def token_dir(home: Path) -> Path:
    return Path(home) / "tokens"


def token_file(home: Path, role: str) -> Path:
    return token_dir(home) / role


def write_private(path: Path, text: str) -> None:
    """Create ``path`` readable by its owner only (0600), its directory 0700, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.chmod(path.parent, 0o700)
    except OSError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def read_token_file(path: Path) -> str | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return text or None


def ensure_token_file(home: Path, role: str) -> tuple[str, Path]:
    """The token in ``$home/tokens/<role>``, created (random, 0600) when missing."""
    path = token_file(home, role)
    token = read_token_file(path)
    if token is None:
        token = new_token()
        write_private(path, token + "\n")
    return token, path


def _home() -> Path:
    from serving.settings import CommonSettings

    return CommonSettings().home


def worker_token(settings=None) -> str | None:
    """The token a worker-side process presents: the setting, else the local worker token file.
    Read afresh at each call, so a token file written after the process started is picked up."""
    if settings is None:
        from serving.settings import CommonSettings

        settings = CommonSettings()
    if getattr(settings, "worker_token", None):
        return settings.worker_token
    return read_token_file(token_file(settings.home, "worker"))


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


# --- the CLI's credentials -------------------------------------------------------------------

def credentials_path() -> Path:
    """``SERVING_CREDENTIALS``, else ``$XDG_CONFIG_HOME/serving/credentials`` (``~/.config/...``)."""
    given = os.environ.get("SERVING_CREDENTIALS")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "serving" / "credentials"


def read_credentials() -> dict:
    try:
        doc = json.loads(credentials_path().read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def save_credentials(token: str, control_plane: str | None) -> Path:
    path = credentials_path()
    doc = {"token": token}
    if control_plane:
        doc["control_plane"] = control_plane.rstrip("/")
    write_private(path, json.dumps(doc) + "\n")
    return path


def is_local(url: str) -> bool:
    return (urlparse(url).hostname or "") in LOCAL_HOSTS


def cli_token(control_plane: str) -> tuple[str | None, str]:
    """The token the CLI sends to ``control_plane`` and where it came from."""
    env = os.environ.get("SERVING_TOKEN")
    if env:
        return env.strip(), "SERVING_TOKEN"
    creds = read_credentials()
    saved_url = (creds.get("control_plane") or "").rstrip("/")
    if creds.get("token") and (not saved_url or saved_url == control_plane.rstrip("/")):
        return str(creds["token"]), str(credentials_path())
    if is_local(control_plane):
        path = token_file(_home(), "admin")
        token = read_token_file(path)
        if token:
            return token, str(path)
    return None, "none"

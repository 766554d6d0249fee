"""Tokens in tests, found the way a user's machine finds them: the bootstrap token files a
control plane writes under its SERVING_HOME (see serving/credentials.py)."""
from __future__ import annotations

from pathlib import Path

from serving.credentials import read_token_file, token_file


def token(home: Path, role: str = "admin") -> str:
    found = read_token_file(token_file(home, role))
    assert found, f"no {role} token under {home}/tokens (has a control plane started with this home?)"
    return found


def headers(home: Path, role: str = "admin") -> dict[str, str]:
    return {"Authorization": f"Bearer {token(home, role)}"}

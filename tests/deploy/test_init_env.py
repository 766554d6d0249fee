"""deploy/init-env.sh: fresh secrets per clone, and the once-published ones replaced.

The published file is read back from the commit that tracked it (46a9e89), so the test uses the
real leaked values without the repository's tip holding them.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.artifacts import DEPLOY, REPO

SECRET_KEYS = ("POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN")
LEAKED_IN = "46a9e89"


def env_values(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {key: value for key, value in pairs}


@pytest.fixture
def deploy_dir(tmp_path) -> Path:
    shutil.copy(DEPLOY / "init-env.sh", tmp_path / "init-env.sh")
    shutil.copy(DEPLOY / ".env.example", tmp_path / ".env.example")
    return tmp_path


def run_init(deploy_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(deploy_dir / "init-env.sh")], capture_output=True, text=True, check=True)


def test_fresh_secrets_each_time(deploy_dir, tmp_path_factory):
    run_init(deploy_dir)
    first = env_values(deploy_dir / ".env")
    other = tmp_path_factory.mktemp("other")
    shutil.copy(deploy_dir / "init-env.sh", other)
    shutil.copy(deploy_dir / ".env.example", other)
    run_init(other)
    second = env_values(other / ".env")
    for key in SECRET_KEYS:
        assert first[key] and first[key] != second[key], key
    assert (deploy_dir / ".env").stat().st_mode & 0o777 == 0o600
    kept = run_init(deploy_dir)  # an .env of its own is left alone
    assert "leaving it" in kept.stdout and env_values(deploy_dir / ".env") == first


def test_published_env_is_moved_aside_and_replaced(deploy_dir):
    shown = subprocess.run(["git", "show", f"{LEAKED_IN}:deploy/.env"], cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0, f"the history holding the published deploy/.env is needed: {shown.stderr}"
    (deploy_dir / ".env").write_text(shown.stdout)
    published = env_values(deploy_dir / ".env")

    result = run_init(deploy_dir)

    assert "once published in the repository" in result.stderr
    assert all(key in result.stderr for key in SECRET_KEYS)
    fresh = env_values(deploy_dir / ".env")
    for key in SECRET_KEYS:
        assert fresh[key] != published[key], key
    (moved,) = deploy_dir.glob(".env.published-*")
    assert env_values(moved) == published
    assert moved.stat().st_mode & 0o777 == 0o600

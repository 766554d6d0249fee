"""What the Dockerfile's build stage installs is a complete, working control plane.

No image can be built here, so this repeats the build stage's Python part on this
machine: only the files the Dockerfile COPYs go into a fresh directory, a wheel is
built from it, installed apart from the source tree, and the control plane is run from
the installed copy (which needs the Alembic migrations shipped as package data).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.deploy.artifacts import REPO
from tests.support.procs import free_port, stop, wait_http


def build_stage_copies() -> list[str]:
    text = (REPO / "Dockerfile").read_text()
    build = text.split("\nFROM ")[1]  # the first (build) stage
    copies = re.findall(r"^COPY (?!--)(.+?) \S+$", build, flags=re.MULTILINE)
    return [p for line in copies for p in line.split()]


@pytest.mark.timeout(240)
def test_the_build_context_installs_a_control_plane_that_runs(tmp_path):
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    paths = build_stage_copies()
    assert {"pyproject.toml", "README.md", "serving", "registry", "preprocess"} <= set(paths)
    for rel in paths:
        src = REPO / rel
        if src.is_dir():
            shutil.copytree(src, ctx / rel, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy(src, ctx / rel)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(ctx)],
                   check=True, timeout=180, cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("serving-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp_path / "site"), str(wheel)],
                   check=True, timeout=180, cwd=tmp_path)

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "SERVING_HOME": str(tmp_path / "home"),
           "SERVING_CONTROL_PLANE_PORT": str(port)}
    env.pop("SERVING_DATABASE_URL", None)
    where = subprocess.run([sys.executable, "-c", "import registry, serving; print(registry.__file__, serving.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
    assert all(p.startswith(str(tmp_path / "site")) for p in where.stdout.split()), where.stdout
    with open(tmp_path / "cp.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "serving.cli.main", "control-plane"], env=env, cwd=tmp_path,
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=60, proc=proc)
    except Exception:
        print((tmp_path / "cp.log").read_text()[-3000:])
        raise
    finally:
        stop(proc)
    import sqlite3

    with sqlite3.connect(tmp_path / "home" / "registry.db") as db:  # the migrations ran from the wheel
        assert db.execute("select version_num from alembic_version").fetchall()

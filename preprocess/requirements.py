"""Python packages an endpoint's ``preprocess.py`` needs, installed when the endpoint loads.

ClearML Serving installs ``CLEARML_EXTRA_PYTHON_PACKAGES`` into the whole container at
start. Here an endpoint can name its own (``serving model add --requirements ...``):
the worker installs them once per distinct set into ``<home>/packages/<hash>`` with pip
and puts that directory on ``sys.path`` before importing the user's file, so a new
endpoint needs no new image and no restart. Worker processes that load the same set
at once wait on a file lock instead of installing twice.
"""
from __future__ import annotations

import fcntl
import hashlib
import subprocess
import sys
from pathlib import Path

from preprocess.user_code import UserCodeError

INSTALL_TIMEOUT_S = 900


def packages_dir(requirements: list[str], root: Path) -> Path:
    digest = hashlib.sha256("\n".join(sorted(r.strip() for r in requirements)).encode()).hexdigest()[:16]
    return root / digest


def ensure_installed(requirements: list[str], root: Path) -> Path | None:
    """Install (once) and put on ``sys.path``; returns the directory, or None when nothing is needed."""
    target = install_once(requirements, root)
    if target is None:
        return None
    if str(target) not in sys.path:
        sys.path.insert(0, str(target))
    return target


def install_once(requirements: list[str], root: Path) -> Path | None:
    """Install into the set's own directory once (processes installing the same set wait on a lock);
    the directory, or None when nothing is needed. Not put on any path: the caller decides whose."""
    requirements = [r.strip() for r in requirements if r and r.strip()]
    if not requirements:
        return None
    target = packages_dir(requirements, root)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / ".complete").exists():
            pip_install(requirements, target)
            (target / ".complete").touch()
    return target


def pip_install(requirements: list[str], target: Path | None = None) -> None:
    """Into ``target``, or into the running interpreter's environment (the worker-wide packages)."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
           *(["--upgrade", "--target", str(target)] if target is not None else []), *requirements]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise UserCodeError(f"installing {requirements} took over {INSTALL_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise UserCodeError(f"pip could not install {requirements}: {' / '.join(tail)}")

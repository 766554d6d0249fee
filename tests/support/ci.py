"""The suite's rule for a test that cannot run here: in CI (``CI=true``) it fails, naming what is
missing; elsewhere it is skipped with that reason. A quiet skip in CI would hide a machine that
lacks a dependency (a fresh one, say) behind a green run."""
from __future__ import annotations

import importlib
import os
from typing import Any, NoReturn

import pytest


def in_ci() -> bool:
    """CI=true (or 1/yes), as GitHub Actions, GitLab CI and .ci/run set it."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def cannot_run(reason: str) -> NoReturn:
    """Skip with ``reason``; in CI, fail with it instead."""
    if in_ci():
        pytest.fail(f"CI=true and this test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


def require_module(name: str) -> Any:
    """The module, or the suite's rule when it is missing (pytest.importorskip would skip in CI too)."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        reason = f"{name} is not installed ({exc}): run `make setup`"
        if in_ci():
            pytest.fail(f"CI=true and this test cannot run: {reason}", pytrace=False)
        pytest.skip(reason, allow_module_level=True)

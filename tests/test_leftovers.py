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

"""The config snapshot never goes back to an older one when refreshes overlap: the periodic database
check and a commit's refresh run on different threads. The database read is stood in for by a
function of the call order (no database is needed to order two threads), so the race is made to
happen every time rather than once in a few hundred runs."""
from __future__ import annotations

import contextlib
import threading

from registry import broadcast
from registry.broadcast import Broadcaster


def test_a_refresh_that_read_before_a_commit_never_publishes_after_it(monkeypatch):
    older_read = threading.Event()   # the periodic check has read the database, before the commit
    release = threading.Event()      # ... and is let go only once the commit's refresh has had its turn
    calls: list[int] = []

    def build_snapshot(_session) -> dict:
        calls.append(1)
        if len(calls) == 1:          # the periodic check: reads the old state, then is slow to publish
            older_read.set()
            release.wait(5)
            return {"revision": 1, "endpoints": {}}
        return {"revision": 2, "endpoints": {"e": {}}}  # the refresh after the deploy's commit

    monkeypatch.setattr(broadcast, "build_snapshot", build_snapshot)
    b = Broadcaster(lambda: contextlib.nullcontext())
    check = threading.Thread(target=b.refresh)
    check.start()
    assert older_read.wait(5)
    commit = threading.Thread(target=b.refresh)
    commit.start()
    commit.join(0.5)                 # unlocked, it would publish revision 2 now
    release.set()
    check.join(5)
    commit.join(5)
    assert b.snapshot == {"revision": 2, "endpoints": {"e": {}}}, "the older read was published last"

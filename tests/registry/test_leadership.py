"""Leader election of control-plane replicas on one database (registry/leadership.py), on a real
PostgreSQL (advisory lock on a dedicated connection) and on SQLite (flock beside the file): one
leads, and when it goes, by stopping, by losing its connection or by its process being killed,
another leads within 2 s. Only the leader's rollout controller ticks; a follower that takes over
mid-rollout finishes it, each step taken once."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg

from registry import schemas
from registry.artifacts import ArtifactStore
from registry.db import libpq_url, make_engine, session_factory, upgrade
from registry.leadership import Leadership
from registry.rollout_metrics import Counters, Quality, Window
from registry.rollouts import RolloutController, Rollouts
from registry.service import Registry
from tests.support.postgres import create_database
from tests.support.procs import REPO, stop, wait_until

FAILOVER_S = 2.0  # the bound the tests hold failover to (the period is 1 s)


def kind(url: str) -> str:
    return url.split(":")[0].split("+")[0]


def leaders(*ls: Leadership) -> list[bool]:
    return [lead.is_leader for lead in ls]


def exactly_one_leads_for(seconds: float, *ls: Leadership) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert sum(leaders(*ls)) == 1, leaders(*ls)
        time.sleep(0.05)


def takeover_s(follower: Leadership, started: float) -> float:
    wait_until(lambda: follower.is_leader, timeout=10, what="the follower to lead", interval=0.01)
    return time.monotonic() - started


def test_one_of_two_leads_and_the_other_takes_over_when_it_stops(database_url):
    a = Leadership(database_url).start()
    b = Leadership(database_url).start()
    gained: list[str] = []
    b.on_gain.append(lambda: gained.append("b"))
    try:
        assert leaders(a, b) == [True, False]
        assert a.state()["leader"] and a.state()["since"] and b.state() == {**b.state(), "leader": False, "since": None}
        exactly_one_leads_for(2.5, a, b)  # the follower keeps trying, and keeps failing
        started = time.monotonic()
        a.stop()
        took = takeover_s(b, started)
        print(f"\n{kind(database_url)}: the follower led {took:.2f} s after the leader stopped")
        assert took < FAILOVER_S
        assert gained == ["b"] and not a.is_leader
    finally:
        a.stop()
        b.stop()


def test_a_killed_leader_process_is_replaced_within_2_s(database_url):
    """The process that leads is SIGKILLed: no clean release, the lock goes with its connection
    (PostgreSQL ends the session) or its open file (the kernel drops the flock)."""
    code = ("import sys, time\nfrom registry.leadership import Leadership\n"
            "lead = Leadership(sys.argv[1]).start()\nprint(lead.is_leader, flush=True)\ntime.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, database_url], cwd=REPO, stdout=subprocess.PIPE, text=True)
    follower = None
    try:
        assert proc.stdout.readline().strip() == "True"
        follower = Leadership(database_url).start()
        time.sleep(1.5)  # a try or two
        assert not follower.is_leader, "the follower took the lock from a live leader"
        started = time.monotonic()
        proc.kill()
        took = takeover_s(follower, started)
        print(f"\n{kind(database_url)}: the follower led {took:.2f} s after the leader's process was killed")
        assert took < FAILOVER_S
    finally:
        stop(proc)
        if follower is not None:
            follower.stop()


def test_a_leader_that_loses_its_connection_stops_leading_and_the_other_takes_over(postgres_admin_url):
    """PostgreSQL: the lock lives in the leader's database session, which the server ends here."""
    database_url = create_database(postgres_admin_url, "leadership_session_ended")
    a = Leadership(database_url).start()
    b = Leadership(database_url).start()
    try:
        assert leaders(a, b) == [True, False]
        database = database_url.rsplit("/", 1)[1]
        with psycopg.connect(libpq_url(postgres_admin_url), autocommit=True) as admin:
            ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = %s "
                                  "AND application_name = 'serving control-plane leader'", (database,)).fetchone()[0]
        assert ended == 1  # only the leader keeps a session open; a follower's try closes its own
        started = time.monotonic()
        took = takeover_s(b, started)
        wait_until(lambda: not a.is_leader, timeout=FAILOVER_S, what="the old leader to see it lost the lock")
        print(f"\nthe follower led {took:.2f} s after the leader's session was ended")
        assert took < FAILOVER_S
        exactly_one_leads_for(2.5, a, b)  # the old leader tries again, and fails
    finally:
        a.stop()
        b.stop()


def test_an_in_memory_database_always_leads():
    lead = Leadership("sqlite://").start()
    try:
        assert lead.is_leader
    finally:
        lead.stop()
    assert not lead.is_leader


# --- the rollout controller -----------------------------------------------------------------------

class HealthyCandidate:
    """A stand-in metrics source: every window passes; it counts what this replica judged, and
    whether each judgement had a baseline this replica took (a per-process thing)."""

    def __init__(self) -> None:
        self.windows = 0
        self.without_baseline = 0

    def snapshot(self, endpoint: str, version: int) -> Counters | None:
        return Counters(requests=0.0)

    def window(self, endpoint: str, version: int, start: Counters | None, seconds: float) -> Window:
        self.windows += 1
        self.without_baseline += start is None
        return Window(requests=100.0, errors=0.0, p99_s=0.01, drift=None)

    def quality(self, endpoint: str, version: int) -> Quality:
        return Quality(0.0, None)


def replica(url: str, store: ArtifactStore) -> tuple[Rollouts, HealthyCandidate]:
    """What one control-plane process has: its own engine (pool), registry and rollouts."""
    registry = Registry(session_factory(make_engine(url)), store)
    source = HealthyCandidate()
    return Rollouts(registry, source), source


def test_only_the_leaders_controller_ticks_and_the_follower_finishes_the_rollout(postgres_admin_url, tmp_path: Path):
    url = create_database(postgres_admin_url, "leadership_rollout")
    upgrade(make_engine(url))
    store = ArtifactStore(tmp_path / "artifacts")
    (tmp_path / "m.bin").write_bytes(b"model")
    sha, _ = store.put_file(tmp_path / "m.bin")
    (ra, source_a), (rb, source_b) = replica(url, store), replica(url, store)
    for _ in range(2):
        ra.registry.add_model(schemas.ModelCreate(name="m", artifact=sha, framework="custom"))
    ra.registry.deploy(schemas.EndpointDeploy(endpoint="e", model="m", version=1, engine="custom"))

    lead_a = Leadership(url).start()
    lead_b = Leadership(url).start()
    controllers = [RolloutController(r, 0.1, leads=lambda lead=lead: lead.is_leader).start()
                   for r, lead in ((ra, lead_a), (rb, lead_b))]
    try:
        assert leaders(lead_a, lead_b) == [True, False]
        # started through the follower, which takes the window's baseline in its own process
        rb.start(schemas.RolloutStart(endpoint="e", model="m", version=2, steps=[10, 25, 50, 75, 100],
                                      interval_s=1.0))
        wait_until(lambda: ra.list("e")[0]["step"] >= 2, timeout=20, what="two steps under the leader")
        assert source_b.windows == 0, "the follower's controller judged a step"
        assert source_a.without_baseline == 0, "the leader judged a window it had no baseline for"
        lead_a.stop()  # the leader goes mid-rollout
        controllers[0].stop()
        judged_by_a = source_a.windows
        done = wait_until(lambda: ra.list("e")[0]["state"] == "succeeded" and ra.list("e")[0], timeout=30,
                          what="the follower to finish the rollout")
        assert lead_b.is_leader and source_b.windows > 0 and source_a.windows == judged_by_a
        assert source_b.without_baseline == 0
    finally:
        for c in controllers:
            c.stop()
        lead_a.stop()
        lead_b.stop()
    events = [(e["event"], e["step"]) for e in done["history"]]
    passed = [step for event, step in events if event == "gates passed"]
    assert passed == [1, 2, 3, 4], events  # each step taken once, in order
    assert sum(event.startswith("promoted") for event, _ in events) == 1, events
    assert [event for event, _ in events].count("resumed after a control-plane restart") == 1, events
    assert done["weight"] == 100
    targets = {t.model.version: (t.role, t.weight) for t in ra.registry.get_endpoint("e").targets}
    assert targets == {2: ("stable", 100.0)}

"""The launcher's replicas (``--aux-config replicas=N``) without vLLM: the "interpreter" here is a shell
script that writes the placement it was given and sleeps, standing in for vLLM only in being a process
the launcher starts, places and stops (tests/serving/llm/test_replicas_e2e.py runs real vLLM replicas)."""
from __future__ import annotations

import os
import stat

from serving.llm.naming import engine_key
from serving.llm.launch.placement import usable_cpus
from tests.serving.llm.launch.test_launcher_states import launcher
from tests.support.procs import wait_until

KEY = engine_key("tiny", 1, {"dtype": "float32"})


def snapshot(replicas: int, revision: int = 1) -> dict:
    return {"revision": revision, "endpoints": {"chat": {
        "engine": "vllm", "engine_options": {"dtype": "float32", "replicas": replicas, "routing": "prefix"},
        "targets": [{"model": "tiny", "version": 1, "artifact": "c" * 64}]}}}


def fake_vllm(tmp_path):
    out = tmp_path / "placed"
    out.mkdir()
    script = tmp_path / "python"
    script.write_text(f'#!/bin/sh\nport=""; prev=""\nfor a in "$@"; do [ "$prev" = "--port" ] && port=$a; prev=$a; done\n'
                      f'echo "$VLLM_CPU_OMP_THREADS_BIND" > {out}/$port\nexec sleep 600\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script, out


def placed(out) -> dict[int, str]:
    return {int(p.name): p.read_text().strip() for p in out.iterdir()}


def test_replicas_start_on_cores_of_their_own_and_scale_without_restarting_the_others(tmp_path):
    script, out = fake_vllm(tmp_path)
    l = launcher(tmp_path, vllm_python=script)
    try:
        l.apply(snapshot(2))
        assert KEY in l.engines, "replicas and routing are not part of the engine's key"
        wait_until(lambda: l.tick() or len(placed(out)) == 2, 30, "two replicas started")
        ports = [r.port for r in l.engines[KEY].replicas]
        cpus = usable_cpus()
        half = len(cpus) // 2
        assert placed(out) == {ports[0]: ",".join(map(str, cpus[:half])), ports[1]: ",".join(map(str, cpus[half:2 * half]))}
        view = l.view()["engines"][KEY]
        assert [r["id"] for r in view["replicas"]] == ["0", "1"] and view["state"] == "starting"
        pids = [r.proc.pid for r in l.engines[KEY].replicas]

        l.apply(snapshot(3, revision=2))
        wait_until(lambda: l.tick() or len(placed(out)) == 3, 30, "a third replica started")
        assert [r.proc.pid for r in l.engines[KEY].replicas[:2]] == pids, "the first two kept running"

        l.apply(snapshot(1, revision=3))
        l.tick()
        assert [r.slot for r in l.engines[KEY].replicas] == [0] and l.engines[KEY].replicas[0].proc.pid == pids[0]
        assert not any(os.path.exists(f"/proc/{pid}") and open(f"/proc/{pid}/stat").read().split()[2] != "Z"
                       for pid in pids[1:]), "the second replica stopped"
    finally:
        l.close()


def test_an_engine_is_failed_only_when_every_replica_is(tmp_path):
    l = launcher(tmp_path, vllm_python=tmp_path / "no-such-python")
    try:
        l.apply(snapshot(2))
        wait_until(lambda: l.tick() or l.view()["engines"][KEY]["state"] == "failed", 20, "failed")
        view = l.view()["engines"][KEY]
        assert [r["state"] for r in view["replicas"]] == ["failed", "failed"]
        assert view["error"].startswith("replica 0: no vLLM interpreter"), view
        assert list(l.readiness()["failures"]) == [KEY]
    finally:
        l.close()


def test_a_folder_that_cannot_be_fetched_fails_every_replica_with_why(tmp_path):
    from serving.llm.launch.launcher import Launcher
    from serving.settings import LLMSettings

    def missing(sha: str):
        raise FileNotFoundError(f"artifact {sha[:6]} is gone")

    l = Launcher(LLMSettings(home=tmp_path / "home", vllm_python=tmp_path / "python"), missing)
    try:
        l.apply(snapshot(2))
        wait_until(lambda: l.tick() or l.view()["engines"][KEY]["state"] == "failed", 20, "failed")
        view = l.view()["engines"][KEY]
        assert [r["error"] for r in view["replicas"]] == ["cannot fetch or unpack the model folder: artifact cccccc is gone"] * 2
    finally:
        l.close()

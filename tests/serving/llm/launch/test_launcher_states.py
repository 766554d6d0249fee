"""The launcher's states without an engine process: what it reports when vLLM is missing or the memory
budget is full (tests/serving/llm/launch/test_launcher_e2e.py runs the real vLLM)."""
from __future__ import annotations

from serving.llm.folder import archive_folder
from serving.llm.launch.launcher import Launcher
from serving.llm.naming import engine_key
from serving.settings import LLMSettings
from tests.support.procs import wait_until


KEY = engine_key("tiny", 1, {"dtype": "float32"})  # its engine: the version and its options


def snapshot(artifact: str) -> dict:
    return {"revision": 3, "endpoints": {"chat": {
        "engine": "vllm", "engine_options": {"dtype": "float32"},
        "targets": [{"model": "tiny", "version": 1, "artifact": artifact}]}}}


def launcher(tmp_path, **settings) -> Launcher:
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    tar = tmp_path / "folder.tar"
    tar.write_bytes(b"".join(archive_folder(folder).chunks()))
    changes = []
    out = Launcher(LLMSettings(home=tmp_path / "home", **settings), lambda sha: tar, on_change=lambda: changes.append(1))
    out.changes = changes
    return out


def settle(l: Launcher) -> dict:
    def failed():
        l.tick()
        engine = l.view()["engines"][KEY]
        return engine if engine["state"] == "failed" else None

    return wait_until(failed, 20, "the engine failed")


def test_without_vllm_the_engine_is_failed_saying_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr("serving.llm.launch.launcher.UNLOAD_GRACE_S", 0.0)
    l = launcher(tmp_path, vllm_python=tmp_path / "no-such-python")
    l.apply(snapshot("a" * 64))
    engine = settle(l)
    assert "no vLLM interpreter" in engine["error"] and "scripts/setup.sh" in engine["error"], engine
    assert engine["served_model_name"] == KEY and engine["url"].startswith("http://127.0.0.1:")
    assert l.readiness() == {"revision": 3, "failures": {KEY: engine["error"]}, "engines": {KEY: {
        "state": "failed", "waking": False, "replicas": 0, "scale_to_zero_after_s": None, "cold_start_s": None}}}
    assert l.changes, "the control plane is told at once"
    l.apply({"revision": 4, "endpoints": {}})
    l.tick()
    assert l.engines == {}, "an undeployed engine is stopped and forgotten"
    assert l.view() == {"engines": {}}


def test_an_engine_past_the_memory_budget_waits_with_the_figures(tmp_path):
    l = launcher(tmp_path, vllm_python=tmp_path / "python", llm_memory_budget_mb=100)
    (tmp_path / "python").write_text("")  # never run: the budget refuses first
    l.apply(snapshot("b" * 64))
    engine = settle(l)
    assert engine["error"].startswith("waiting for memory: the engines' budget is 100 MB"), engine
    assert "this one needs about 4424 MB" in engine["error"]
    l.close()


def test_the_map_is_answered_while_a_tick_holds_the_lock(tmp_path, monkeypatch):
    """A tick may hold the lock for seconds (an engine stopping waits up to 15 s): meanwhile every
    worker's GET /engines gets the last map, after at most VIEW_WAIT_S, not a timeout."""
    import threading
    import time

    monkeypatch.setattr("serving.llm.launch.launcher.UNLOAD_GRACE_S", 0.0)
    l = launcher(tmp_path, vllm_python=tmp_path / "no-such-python")
    l.apply(snapshot("c" * 64))
    before = settle(l)
    held, release = threading.Event(), threading.Event()

    def long_tick():
        with l.lock:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=long_tick)
    thread.start()
    try:
        held.wait(5)
        t0 = time.monotonic()
        during = l.view()
        waited = time.monotonic() - t0
    finally:
        release.set()
        thread.join()
    assert during == {"engines": {KEY: before}}, "the last map read"
    assert 0.4 <= waited < 2.0, waited

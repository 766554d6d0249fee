"""`serving llm` (started by `serving up`): the launcher as a process of its own.

Run alone with ``python -m serving.llm.launch.main``. It stops its engines on SIGTERM/SIGINT; should it be
killed outright, each engine gets SIGTERM from the kernel (``PR_SET_PDEATHSIG``).
"""
from __future__ import annotations

import logging
import signal
import threading

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from serving.artifact_client import ArtifactFetcher
from serving.config_client import ConfigSubscriber
from serving.llm.launch.metrics import EngineMetrics
from serving.llm.launch.http import EnginesServer
from serving.llm.kube.acting import LeaderCheck
from serving.llm.kube.engines import KubeEngines
from serving.llm.kube.idle import ColdStarts
from serving.llm.launch.launcher import Launcher
from serving.llm.launch.sleep import Sleep
from serving.readiness_report import ReadinessReporter, process_id
from serving.settings import LLMSettings

log = logging.getLogger(__name__)

TICK_S = 1.0
COLD_START_BUCKETS = (5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600)


def run_launcher(settings: LLMSettings, stop: threading.Event | None = None,
                 started: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set (or SIGTERM/SIGINT in a process of its own)."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = stop or _stop_on_signals()
    fetcher = ArtifactFetcher(settings.control_plane_url, settings.home / "cache",
                              shared_dir=settings.resolved_artifact_dir())
    reporter = ReadinessReporter(settings.control_plane_url, process_id("llm"), lambda: launcher.readiness(),
                                 kind="llm")
    registry = CollectorRegistry(auto_describe=False)
    cold_starts = Histogram("serving_llm_cold_start_seconds", "From an engine's wake call (scaled to zero) to its "
                            "first Ready pod", ["endpoint", "version"], registry=registry, buckets=COLD_START_BUCKETS)

    def measured(key: str, seconds: float) -> None:
        for endpoint in metrics.endpoints.get(key, []):
            cold_starts.labels(endpoint, key.rsplit(":", 1)[1].partition("@")[0]).observe(seconds)

    if settings.llm_on_kubernetes:
        acts = LeaderCheck(settings.llm_leader_url) if settings.llm_leader_url else (lambda: True)
        launcher = KubeEngines.from_settings(settings, reporter.poke, acts, ColdStarts(measured))
    else:
        launcher = Launcher(settings, fetcher.path, on_change=reporter.poke, sleep=Sleep(on_cold_start=measured))
    metrics = EngineMetrics(launcher.view)
    registry.register(metrics)
    server = EnginesServer(launcher.view, settings.llm_launcher_host, settings.llm_launcher_port,
                           metrics=lambda: generate_latest(registry), wake=launcher.wake).start()

    def apply(snapshot: dict) -> None:
        metrics.follow(snapshot)
        launcher.apply(snapshot)

    reporter.start()
    subscriber = ConfigSubscriber(settings.control_plane_url, apply,
                                  cache_path=settings.home / "llm-config.json").start()
    log.info("LLM launcher: engines at http://%s:%d/engines, vLLM %s", settings.llm_launcher_host, server.port,
             settings.vllm_python or "not found")
    if started is not None:
        started.set()
    try:
        while not stop.wait(TICK_S):
            launcher.tick()
    finally:
        subscriber.stop()
        launcher.close()
        reporter.stop()
        server.close()


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    return stop


def main() -> None:
    run_launcher(LLMSettings())


if __name__ == "__main__":
    main()

"""`serving triton-sidecar`: one Triton pod's own model loader, beside NVIDIA's tritonserver.

Why: with several Triton pods the control plane cannot load models through the Service (each
load reaches one pod, chosen by kube-proxy), and a new pod must get every model on its own,
with no request from anyone. So each pod runs this next to its tritonserver: it follows the
control plane's config stream, fetches the artifacts by hash, writes the pod's own model
repository (an emptyDir both containers mount) with the same writer the control plane uses
(serving/triton/repository.py: ``RepositorySync``), loads and unloads over localhost
(``--model-control-mode=explicit``), loads again what a restarted tritonserver lost, serves the
pod's readiness (serving/triton/pod_readiness.py: ready once every deployed model is loaded), and
reports the models Triton refused to the control plane, as the embedded Triton does
(serving/readiness_report.py, kind ``triton``).
The embedded Triton (`serving triton`) does all of this itself, in its own process.
"""
from __future__ import annotations

import logging
import threading

from serving.artifact_client import ArtifactFetcher
from serving.config_client import ConfigSubscriber
from serving.readiness_report import ReadinessReporter, process_id
from serving.settings import TritonSidecarSettings
from serving.triton.embedded import handle_signals
from serving.triton.pod_readiness import ReadinessServer
from serving.triton.repository import RepositorySync

log = logging.getLogger(__name__)

RETRY_PERIOD_S = 2.0  # loads tried again while tritonserver starts, lost models noticed


def run_sidecar(settings: TritonSidecarSettings, stop: threading.Event | None = None) -> None:
    """Serve until ``stop`` is set, or SIGTERM/SIGINT when run as the process's entry point."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    own = stop is None  # the process's entry point: SIGTERM/SIGINT stop it
    stop = stop or threading.Event()
    restore_signals = handle_signals(stop) if own else (lambda: None)
    repo = settings.resolved_model_repository()
    fetcher = ArtifactFetcher(settings.control_plane_url, settings.home / "cache")
    sync = RepositorySync(repo, fetcher.path, settings.triton_control_url, retry_period_s=RETRY_PERIOD_S)
    readiness = ReadinessServer(settings.triton_host, settings.triton_readiness_port,
                                sync.readiness).start()
    reporter = ReadinessReporter(settings.control_plane_url, process_id("triton"), sync.report, kind="triton").start()
    subscriber = ConfigSubscriber(settings.control_plane_url, sync.apply,
                                  cache_path=settings.home / "triton-sidecar-config.json").start()
    log.info("triton sidecar: repository %s, Triton %s, readiness on %s:%d", repo, settings.triton_control_url,
             settings.triton_host, settings.triton_readiness_port)
    try:
        stop.wait()
    finally:
        subscriber.stop()
        reporter.stop()
        readiness.close()
        restore_signals()


def main() -> None:
    run_sidecar(TritonSidecarSettings())


if __name__ == "__main__":
    main()

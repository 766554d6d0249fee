"""Embedded Triton for `serving triton` and `serving up`: a real tritonserver, no container.

Each ONNX model runs in Triton's own Python backend: the model repository entry written by
serving/triton/python_backend.py holds a ``model.py`` (serving/triton/backend_model.py) that
opens one onnxruntime session in the backend's stub process and answers each batch Triton's
dynamic batcher forms with one ``session.run``. The nvidia-pytriton wheel is used only for the
``tritonserver`` binary and Python backend it ships; its proxy and tensor store are not in the
path. Workers talk to it exactly as to a standalone Triton (gRPC/HTTP, model
``{model}_v{version}``), so swapping in a GPU Triton later changes a URL, not code.

It follows the control plane's snapshots (ConfigSubscriber), fetches artifacts by hash, and
loads/unloads models in the running server (``--model-control-mode=explicit``), no restart.
Run it alone with ``python -m serving.triton.embedded``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from serving.artifact_client import ArtifactFetcher
from serving.config_client import ConfigSubscriber
from serving.credentials import worker_token
from serving.readiness_report import ReadinessReporter, process_id
from serving.ort import session as ort_session
from serving.settings import TritonSettings
from serving.supervisor import stop_process
from serving.triton.budget import MB, MemoryBudget
from serving.triton.loader import ModelLoader
from serving.triton.loader_http import LoaderServer
from serving.triton.python_backend import (
    ACCESS_HEADER, SHM_PREFIX, control_call, has_gpu, instance_layout, remove_shm, server_command, start_server, write_entry,
)
from serving.triton.model_formats import EMBEDDED_BACKENDS, unservable_message
from serving.triton.pod_readiness import Latch, LoadState, ReadinessServer, could_not_try
from serving.triton.repository import TritonTarget, triton_targets, write_model

log = logging.getLogger(__name__)

RECONCILE_PERIOD_S = 2.0  # retry targets not bound yet, reload models Triton lost
UNLOAD_GRACE_S = 5.0  # a replaced model stays loaded this long after its replacement: workers switch first
PR_SET_CHILD_SUBREAPER = 36
WORKSPACE_PREFIX = "serving-triton-"


def adopt_orphans() -> None:
    """Become the subreaper of our descendants: a Python-backend stub whose tritonserver died is
    reparented to this process (not to init), so ``kill_descendants`` still finds it."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except OSError:
        pass


def kill_descendants(grace_s: float = 3.0) -> int:
    """Stop every process under this one (tritonserver, its Python-backend stubs): SIGTERM, then SIGKILL after ``grace_s``; reaps them. Returns how many."""
    import psutil

    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        return 0
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


def clean_stale(tmpdir: str | None = None) -> list[int]:
    """Cleanup on start: what an embedded Triton killed with ``kill -9`` left behind.

    Its workspace is ``serving-triton-<pid>-<id>``; when that pid is gone, kill every process
    still running from the workspace (tritonserver, stubs) and remove it. Returns the pids killed.
    """
    import psutil

    root = Path(tmpdir or tempfile.gettempdir())
    dead: list[str] = []
    for ws in root.glob(f"{WORKSPACE_PREFIX}*"):
        m = re.match(rf"{WORKSPACE_PREFIX}(\d+)-", ws.name)
        if m and int(m.group(1)) != os.getpid() and not psutil.pid_exists(int(m.group(1))):
            dead.append(str(ws))
            remove_shm(f"{SHM_PREFIX}{m.group(1)}-")
    if not dead:
        return []
    killed = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info.get("cmdline") or [])
        if any(ws in cmd for ws in dead) and p.pid != os.getpid():
            try:
                p.kill()
                killed.append(p.pid)
            except psutil.Error:
                pass
    for ws in dead:
        shutil.rmtree(ws, ignore_errors=True)
    if killed or dead:
        log.warning("removed %d stale Triton workspace(s), killed %d leftover process(es)", len(dead), len(killed))
    return killed


def fix_library_path() -> None:
    """The python-backend stub loads libpython from the library path; point it at ours.

    Without this it may pick up another libpython and fail with
    ``'_thread.RLock' object has no attribute '_recursion_count'``.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    current = os.environ.get("LD_LIBRARY_PATH", "")
    if libdir and libdir not in current.split(":"):
        os.environ["LD_LIBRARY_PATH"] = f"{libdir}:{current}" if current else libdir


def session_signature(session: Any) -> dict[str, Any]:
    """Fallback signature read from the ONNX graph when the snapshot carries none."""
    def spec(arg: Any) -> dict[str, Any]:
        dtype = arg.type.removeprefix("tensor(").removesuffix(")")
        names = {"float": "FP32", "double": "FP64", "string": "BYTES", "float16": "FP16"}
        shape = [d if isinstance(d, int) else -1 for d in arg.shape]
        return {"name": arg.name, "dtype": names.get(dtype, dtype.upper()), "shape": shape}

    return {"inputs": [spec(a) for a in session.get_inputs()], "outputs": [spec(a) for a in session.get_outputs()]}


class ModelBinder:
    """Keeps the model repository and the running tritonserver equal to the newest snapshot."""

    def __init__(self, server: subprocess.Popen, repo_dir: Path, artifact_path: Callable[[str], Path],
                 ort_threads: int | None, http_url: str, token: str) -> None:
        self.server = server
        self.repo_dir = repo_dir
        self.artifact_path = artifact_path
        self.ort_threads = ort_threads  # None: python_backend.instance_layout decides
        self.gpu = has_gpu()
        self.http_url = http_url
        self.headers = {ACCESS_HEADER: token}
        self.bound: dict[str, str] = {}  # triton name -> artifact sha
        self.wanted: dict[str, TritonTarget] = {}
        self.signatures: dict[str, dict[str, Any]] = {}  # artifact -> signature read from the graph
        self.lock = threading.RLock()  # loads and liveness checks must not interleave
        self.closed = False
        self.revision = -1
        self.configured = False  # a snapshot was applied (pod readiness: serving/triton/pod_readiness.py)
        self.refused: dict[str, str] = {}  # triton name -> why Triton (or its format) refused its load
        self.latch = Latch()  # one binder per tritonserver's life: a restarted one waits for its models again
        self.failures: dict[str, str] = {}  # triton name -> why its last load failed (readiness report)
        self.unwanted_since: dict[str, float] = {}  # loaded, no longer deployed: unloaded after a grace
        self.reporter: ReadinessReporter | None = None
        self.loader: ModelLoader | None = None  # memory budget: models load on demand (serving/triton/loader.py)
        self.users: dict[str, list[tuple[str, str, int]]] = {}  # triton name -> (endpoint, model, version)
        self.recorder: Any = None  # statistics: each new load failure (serving_model_load_failures_total)

    def use_budget(self, limit_bytes: int, known_good: dict[str, str]) -> ModelLoader:
        """Hold models within ``limit_bytes``: each is loaded once when deployed (admission), then
        unloaded and loaded again on demand by the loader; ``bound`` then means admitted."""
        def full(name: str) -> int:
            target = self.wanted[name]
            return instance_layout(int(target.batching.get("instances") or 1), self.ort_threads, gpu=self.gpu)[0]

        def check(name: str) -> None:
            ort_session(self.artifact_path(self.wanted[name].artifact), 1)

        self.loader = ModelLoader(self.http_url, self.headers, self.server.pid, MemoryBudget(limit_bytes),
                                  lambda name, n: self._write(self.wanted[name], n), full, check, known_good)
        return self.loader

    def apply(self, snapshot: dict[str, Any]) -> None:
        """ConfigSubscriber callback: never raises, a bad target must not block the others."""
        with self.lock:
            self.wanted = triton_targets(snapshot)
            self.revision = int(snapshot.get("revision", -1))
            self.users = target_users(snapshot)
            self.reconcile()
            self.configured = True

    def pod_readiness(self) -> dict[str, Any]:
        """GET /ready: every deployed model loaded (or refused), and tritonserver running."""
        with self.lock:
            report = self.latch.report(LoadState(self.configured, set(self.wanted), set(self.bound),
                                                 dict(self.refused)))
        if not self.alive():
            report["ready"] = False
        return report

    def readiness(self) -> dict[str, Any]:
        """The embedded Triton's readiness report: the models it failed to load, and why."""
        with self.lock:
            return {"revision": self.revision, "failures": dict(self.failures)}

    def reconcile(self) -> None:
        """Make Triton hold exactly what the registry deploys: (re)write and load what is missing
        or changed, load again what Triton lost (a model unloaded through its control API, a failed
        load), then unload what is no longer wanted (``_unload_unwanted``)."""
        with self.lock:
            if self.closed:
                return
            for name in self._lost():
                log.warning("Triton no longer has %s ready (unloaded behind our back?); loading it again", name)
                self.bound.pop(name, None)
            failures = dict(self.failures)
            for name, target in self.wanted.items():  # load first: the models they replace still answer
                self._guard(self._load, target)
            self.failures = {n: why for n, why in self.failures.items() if n in self.wanted}
            self.refused = {n: why for n, why in self.refused.items() if n in self.wanted}
            self._unload_unwanted()
        if self.reporter is not None and failures != self.failures:
            self.reporter.poke()

    def _unload_unwanted(self) -> None:
        """Unload what is no longer deployed once every deployed model is loaded, and UNLOAD_GRACE_S
        after that: workers keep routing to a replaced version until they see its replacement ready
        (serving/worker/gate.py), and a replacement that fails to load leaves the old one answering."""
        now = time.monotonic()
        self.unwanted_since = {n: t for n, t in self.unwanted_since.items() if n in self.bound and n not in self.wanted}
        if any(name not in self.bound for name in self.wanted):
            return
        for name in [n for n in list(self.bound) if n not in self.wanted]:
            if now - self.unwanted_since.setdefault(name, now) >= UNLOAD_GRACE_S:
                self._guard(self._unload, name)

    def _lost(self) -> list[str]:
        """Loaded models Triton's repository index does not show READY (with a budget, the loader
        tells cold models from lost ones itself)."""
        if not self.bound or self.loader is not None:
            return []
        try:
            index = control_call(self.http_url, self.headers, 5.0, "get_model_repository_index")
        except Exception as exc:  # server down or restarting: the liveness check deals with that
            log.debug("cannot read Triton's repository index: %s", exc)
            return []
        ready = {m.get("name") for m in index if isinstance(m, dict) and m.get("state") == "READY"}
        return [name for name in self.bound if name not in ready]

    def alive(self) -> bool:
        return self.server.poll() is None

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def _guard(self, action: Callable, arg: Any) -> None:
        name = getattr(arg, "name", arg)
        try:
            action(arg)
            self.failures.pop(name, None)
            self.refused.pop(name, None)
        except Exception as exc:
            log.exception("triton %s(%s) failed; will retry", action.__name__.strip("_"), name)
            if action == self._load:
                why, before = _brief(exc), self.failures.get(name)
                self.failures[name] = why
                if not could_not_try(exc):
                    self.refused[name] = why
                if why != before:  # retried every RECONCILE_PERIOD_S: counted once per new failure
                    self._record_failure(name)

    def _record_failure(self, name: str) -> None:
        record = getattr(self.recorder, "record_load", None)
        for endpoint, model, version in self.users.get(name, []) if record else []:
            record(endpoint, version, model=model, engine="triton", state="failed", reason="model")

    def _signature(self, target: TritonTarget, onnx_path: Path) -> dict[str, Any]:
        if target.signature:
            return target.signature
        if target.artifact not in self.signatures:
            self.signatures[target.artifact] = session_signature(ort_session(onnx_path, 1))
        return self.signatures[target.artifact]

    def _load(self, target: TritonTarget) -> None:
        """Write the model's repository entry; load it when new, changed or lost (a load of a
        loaded model makes Triton swap in the new files)."""
        if target.format.name != "onnx":
            return self._load_own(target)
        if self.loader is not None:  # memory budget: admitted once (loaded, measured), then on demand
            changed = self._write(target, self.loader.instances(target.name))
            if changed or self.bound.get(target.name) != target.artifact:
                self.loader.admit(target.name, target.artifact)
                self.bound[target.name] = target.artifact
            return
        instances, threads = instance_layout(int(target.batching.get("instances") or 1), self.ort_threads,
                                             gpu=self.gpu)
        changed = self._write(target, instances, threads)
        if not changed and self.bound.get(target.name) == target.artifact:
            return
        control_call(self.http_url, self.headers, 120.0, "load_model", target.name)
        self.bound[target.name] = target.artifact
        log.info("loaded %s (artifact %s, %d instance(s) x %d onnxruntime thread(s))",
                 target.name, target.artifact[:12], instances, threads)

    def _load_own(self, target: TritonTarget) -> None:
        """A model of another format than ONNX: a Python-backend model runs as it came (its own
        model.py and config.pbtxt, under its Triton name), outside the memory budget (which measures
        onnxruntime sessions); a format without a backend here fails to load, naming the way."""
        if target.format.name not in EMBEDDED_BACKENDS:
            raise RuntimeError(unservable_message(target.format, target.name))
        if self.loader is not None:
            self.loader.forget(target.name)
        changed = write_model(self.repo_dir, target, self.artifact_path(target.artifact), aux=False)
        if not changed and self.bound.get(target.name) == target.artifact:
            return
        control_call(self.http_url, self.headers, 120.0, "load_model", target.name)
        self.bound[target.name] = target.artifact
        log.info("loaded %s (%s, artifact %s)", target.name, target.format.words, target.artifact[:12])

    def _write(self, target: TritonTarget, instances: int, threads: int | None = None) -> bool:
        """Write (or refresh) the model's repository entry; whether anything changed."""
        onnx_path = self.artifact_path(target.artifact)
        threads = threads or self.ort_threads or max(1, (os.cpu_count() or 1) // instances)
        return write_entry(self.repo_dir, target, onnx_path, self._signature(target, onnx_path), threads,
                           instances)

    def _unload(self, name: str) -> None:
        if self.loader is not None:
            self.loader.forget(name)
        control_call(self.http_url, self.headers, 60.0, "unload_model", name)
        self.bound.pop(name, None)
        shutil.rmtree(self.repo_dir / name, ignore_errors=True)
        log.info("unloaded %s", name)


def _brief(exc: Exception, limit: int = 500) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def handle_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM/SIGINT only set ``stop``; cleanup runs in the main flow (workspace, server)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in previous:
        signal.signal(sig, lambda *_: stop.set())

    def restore() -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    return restore


def target_users(snapshot: dict[str, Any]) -> dict[str, list[tuple[str, str, int]]]:
    """Which endpoint versions each Triton model serves (a load failure is counted for each)."""
    users: dict[str, list[tuple[str, str, int]]] = {}
    for ep_name, ep in (snapshot.get("endpoints") or {}).items():
        if ep.get("engine") == "triton":
            for t in ep.get("targets") or []:
                if t.get("triton_name"):
                    users.setdefault(t["triton_name"], []).append((ep_name, t["model"], int(t["version"])))
    return users


def _serve(stop: threading.Event, binder: ModelBinder) -> bool:
    """Watch the server every second; retry unbound targets now and then. True if Triton died."""
    last_reconcile = time.monotonic()
    while not stop.wait(1.0):
        if not binder.alive():
            return True
        if time.monotonic() - last_reconcile >= RECONCILE_PERIOD_S:
            binder.reconcile()
            if binder.loader is not None:
                binder.loader.refresh()  # budget: Triton's view, memory measured, instances by use
            last_reconcile = time.monotonic()
    return False


MAX_RESTARTS = 5  # in-process restarts of a dying tritonserver within RESTART_WINDOW_S, then give up
RESTART_WINDOW_S = 60.0


def run_embedded_triton(settings: TritonSettings, stop_event: threading.Event | None = None,
                        *, ort_threads: int | None = None, restart: bool = True) -> None:
    """Serve until ``stop_event`` is set or SIGTERM/SIGINT.

    When tritonserver dies (``kill -9``, a crash) its leftovers are stopped and a new one is
    started in this process at once, with every model the registry deploys loaded again: no
    Python start-up to wait for. Raises once it dies ``MAX_RESTARTS`` times in
    ``RESTART_WINDOW_S`` (or at the first death with ``restart=False``), and `serving up`
    starts the whole process again.
    """
    _default_logging()
    stop = stop_event or threading.Event()
    restore_signals = handle_signals(stop)
    fix_library_path()
    own_process = threading.current_thread() is threading.main_thread() and stop_event is None
    if own_process:  # `serving triton`: the process is ours; an embedding test process is not
        adopt_orphans()
        clean_stale()
    threads = ort_threads or settings.triton_ort_threads or None
    deaths: list[float] = []
    known_good: dict[str, str] = {}  # budget: models that loaded fine, still loadable after a restart
    try:
        while _run_once(settings, stop, threads, own_process, known_good):
            now = time.monotonic()
            deaths = [t for t in deaths if now - t < RESTART_WINDOW_S] + [now]
            if not restart or len(deaths) >= MAX_RESTARTS or stop.is_set():
                raise RuntimeError(f"tritonserver exited unexpectedly ({len(deaths)} time(s) "
                                   f"in {RESTART_WINDOW_S:.0f}s)")
            log.warning("tritonserver exited unexpectedly; starting a new one (%d in %.0fs)",
                        len(deaths), RESTART_WINDOW_S)
    finally:
        restore_signals()


def _wait_live(server: subprocess.Popen, http_url: str, stop: threading.Event, timeout: float = 120.0) -> bool:
    import tritonclient.http as httpclient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        if server.poll() is not None:
            return False
        client = httpclient.InferenceServerClient(http_url, connection_timeout=2.0, network_timeout=2.0)
        try:
            if client.is_server_live():
                return True
        except Exception:
            pass
        finally:
            client.close()
        time.sleep(0.1)
    if stop.is_set():
        return False
    raise RuntimeError(f"tritonserver not live at {http_url} after {timeout:.0f}s")


def _run_once(settings: TritonSettings, stop: threading.Event, threads: int | None, own_process: bool,
              known_good: dict[str, str]) -> bool:
    """One tritonserver's life; True if it died under us."""
    # Unique path: two servers on one box must never share a repository (clean_stale keys on the pid).
    workspace = Path(tempfile.gettempdir()) / f"{WORKSPACE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    repo_dir = workspace / "models"
    repo_dir.mkdir(parents=True)
    host = settings.triton_host
    command = server_command(workspace, repo_dir, host, settings.triton_http_port, settings.triton_grpc_port,
                             settings.triton_metrics_port, tracing=settings.tracing_otlp_endpoint)
    http_url = f"{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{settings.triton_http_port}"
    server = start_server(command)
    subscriber: ConfigSubscriber | None = None
    binder: ModelBinder | None = None
    loader_server: LoaderServer | None = None
    readiness: ReadinessServer | None = None
    died = False
    try:
        if not _wait_live(server, http_url, stop):
            return server.poll() is not None and not stop.is_set()
        fetcher = ArtifactFetcher(settings.control_plane_url, settings.home / "cache",
                                  shared_dir=settings.resolved_artifact_dir())
        binder = ModelBinder(server, repo_dir, fetcher.path, threads, http_url, command.token)
        binder.recorder = _load_recorder()
        if settings.triton_memory_budget_mb > 0:
            loader = binder.use_budget(settings.triton_memory_budget_mb * MB, known_good)
            loader_server = LoaderServer(loader, host, settings.triton_loader_port,
                                         lambda: worker_token(settings)).start()
            log.info("memory budget %d MB: models load on demand (loader on port %d)",
                     settings.triton_memory_budget_mb, settings.triton_loader_port)
        if settings.triton_readiness_port > 0:
            readiness = ReadinessServer(host, settings.triton_readiness_port, binder.pod_readiness).start()
        binder.reporter = ReadinessReporter(settings.control_plane_url, process_id("triton"), binder.readiness,
                                            kind="triton").start()
        subscriber = ConfigSubscriber(settings.control_plane_url, binder.apply,
                                      cache_path=settings.home / "triton-config.json").start()
        log.info("embedded triton ready: grpc %s:%s http %s", host, settings.triton_grpc_port, http_url)
        died = _serve(stop, binder)
    finally:
        if readiness is not None:
            readiness.close()
        if loader_server is not None:
            loader_server.close()
        if subscriber is not None:
            subscriber.stop()
        if binder is not None:
            binder.close()
            if binder.recorder is not None:
                binder.recorder.close()
            if binder.reporter is not None:
                binder.reporter.stop(say_gone=not died)
        stop_process(server, 0.3 if died else 6.0)
        if own_process:  # after a crash nothing is worth waiting for: every second is downtime
            n = kill_descendants(grace_s=0.3 if died else 3.0)
            if n:
                log.warning("stopped %d process(es) tritonserver left behind", n)
        shutil.rmtree(workspace, ignore_errors=True)
        remove_shm(command.shm_prefix)
    return died


def _load_recorder() -> Any:
    """The statistics recorder for load failures, configured as the workers' is (the same
    ``SERVING_STATISTICS_*`` / ``SERVING_KAFKA_*`` variables); None with statistics off."""
    from serving.settings import WorkerSettings
    from serving.statistics.recorder import recorder_from_settings

    settings = WorkerSettings()
    return recorder_from_settings(settings, follow_config=False) if settings.statistics_enabled else None


def _default_logging() -> None:
    """As a process entry point (CLI), log loads/unloads; leave a host app's logging alone."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main() -> None:
    run_embedded_triton(TritonSettings())


if __name__ == "__main__":
    main()

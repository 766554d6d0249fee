"""Embedded Triton for `serving triton` and `serving up`: a real tritonserver, no container.

The PyTriton wheel ships tritonserver with only the python backend, so each ONNX
model is served by an onnxruntime session in this process, bound through
PyTriton behind Triton's own dynamic batcher. Workers talk to it exactly as to
a standalone Triton (gRPC/HTTP, model ``{model}_v{version}``), so swapping in a
GPU Triton later changes a URL, not code.

It follows the control plane's snapshots (ConfigSubscriber), fetches artifacts
by hash, and binds models added later into the running server, no restart.
Run it alone with ``python -m serving.triton.embedded``.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import sysconfig
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

import numpy as np

from serving.artifact_client import ArtifactFetcher
from serving.config_client import ConfigSubscriber
from serving.ort import session as ort_session
from serving.settings import TritonSettings
from serving.triton.naming import TRITON_VERSION
from serving.triton.repository import TritonTarget, triton_targets

log = logging.getLogger(__name__)

RECONCILE_PERIOD_S = 2.0  # retry targets not bound yet, reload models Triton lost
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
    """Stop every process under this one (tritonserver, stubs, PyTriton's tensor store and
    resource tracker): SIGTERM, then SIGKILL after ``grace_s``; reaps them. Returns how many."""
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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


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
        if m and int(m.group(1)) != os.getpid() and not _pid_alive(int(m.group(1))):
            dead.append(str(ws))
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


def default_ort_threads() -> int:
    """Every core: the model is most of the work, and the workers' share (HTTP, tokenizing) is
    small and mostly spent while Triton waits for a batch; spinning is off, so idle threads cost
    nothing (half the cores left the W2 benchmark at 40% of the ceiling)."""
    return os.cpu_count() or 1


def triton_config(settings: TritonSettings) -> Any:
    """Ports from settings, loopback by default (Triton would bind 0.0.0.0 otherwise)."""
    from pytriton.triton import TritonConfig

    host = settings.triton_host
    return TritonConfig(
        http_address=host, http_port=settings.triton_http_port,
        grpc_address=host, grpc_port=settings.triton_grpc_port,
        metrics_address=host, metrics_port=settings.triton_metrics_port,
        allow_gpu_metrics=False, exit_timeout_secs=5, log_verbose=0,
    )


def session_signature(session: Any) -> dict[str, Any]:
    """Fallback signature read from the ONNX graph when the snapshot carries none."""
    def spec(arg: Any) -> dict[str, Any]:
        dtype = arg.type.removeprefix("tensor(").removesuffix(")")
        names = {"float": "FP32", "double": "FP64", "string": "BYTES", "float16": "FP16"}
        shape = [d if isinstance(d, int) else -1 for d in arg.shape]
        return {"name": arg.name, "dtype": names.get(dtype, dtype.upper()), "shape": shape}

    return {"inputs": [spec(a) for a in session.get_inputs()], "outputs": [spec(a) for a in session.get_outputs()]}


def tensors(specs: list[dict[str, Any]], batched: bool) -> list[Any]:
    """PyTriton tensors. With batching on, the batch dimension is Triton's, so it is stripped from
    the signature shape; with it off (``max_batch_size: 0``) the model sees whole shapes, as in a
    config.pbtxt, and the worker's ``[1, seq]`` requests must match them."""
    from pytriton.model_config import Tensor
    from tritonclient.utils import triton_to_np_dtype

    out = []
    for spec in specs:
        dtype = triton_to_np_dtype(spec["dtype"].upper())
        dtype = bytes if dtype is np.object_ else dtype
        out.append(Tensor(name=spec["name"], dtype=dtype, shape=tuple(spec["shape"][int(batched):]) or (1,)))
    return out


def make_infer_fn(session: Any, input_names: list[str], output_names: list[str]) -> Callable:
    """Triton's batcher only groups same-shape requests, so @batch can concatenate them
    (without batching each call holds one request, which @batch passes through)."""
    from pytriton.decorators import batch

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {name: inputs[name] for name in input_names}
        return dict(zip(output_names, session.run(output_names, feeds)))

    return infer


def pytriton_model_config(batching: dict[str, Any]) -> Any:
    from pytriton.model_config import DynamicBatcher, ModelConfig

    max_batch = int(batching.get("max_batch_size") or 0)
    preferred = sorted({int(s) for s in batching.get("preferred_batch_sizes") or [] if 0 < int(s) <= max_batch})
    batcher = DynamicBatcher(max_queue_delay_microseconds=int(batching.get("max_queue_delay_us") or 0),
                             preferred_batch_size=preferred or None)
    return ModelConfig(batching=max_batch > 0, max_batch_size=max(max_batch, 1), batcher=batcher)


class ModelBinder:
    """Binds each triton-engine target of the newest snapshot into the running PyTriton server."""

    def __init__(self, triton: Any, artifact_path: Callable[[str], Path], ort_threads: int, http_url: str) -> None:
        self.triton = triton
        self.artifact_path = artifact_path
        self.ort_threads = ort_threads
        self.http_url = http_url
        self.bound: dict[str, str] = {}  # triton name -> artifact sha
        self.wanted: dict[str, TritonTarget] = {}
        self.lock = threading.RLock()  # binding and liveness checks must not interleave
        self.closed = False

    def apply(self, snapshot: dict[str, Any]) -> None:
        """ConfigSubscriber callback: never raises, a bad target must not block the others."""
        with self.lock:
            self.wanted = triton_targets(snapshot)
            self.reconcile()

    def reconcile(self) -> None:
        """Make Triton hold exactly what the registry deploys: unbind what is no longer wanted
        (or changed artifact), bind what is missing, and bind again what Triton lost (a model
        unloaded through its control API, a failed reload)."""
        with self.lock:
            if self.closed:
                return
            for name in self._lost():
                log.warning("Triton no longer has %s ready (unloaded behind our back?); loading it again", name)
                self._guard(self._unbind, name)
            for name, artifact in list(self.bound.items()):
                if self.wanted.get(name) is None or self.wanted[name].artifact != artifact:
                    self._guard(self._unbind, name)
            for name, target in self.wanted.items():
                if name not in self.bound:
                    self._guard(self._bind, target)

    def _lost(self) -> list[str]:
        """Bound models Triton does not report ready (its repository index does not list models
        PyTriton loads with their files inline, so each is asked)."""
        if not self.bound:
            return []
        import tritonclient.http as httpclient
        from pytriton.client.auth import create_auth_headers

        client = httpclient.InferenceServerClient(self.http_url, network_timeout=5.0, connection_timeout=5.0)
        lost = []
        try:
            headers = create_auth_headers(self.triton.get_access_token(), "http")
            if not client.is_server_live(headers=headers):
                return []
            for name in self.bound:
                if not client.is_model_ready(name, headers=headers):
                    lost.append(name)
        except Exception as exc:  # server down or restarting: the liveness check deals with that
            log.debug("cannot ask Triton which models are ready: %s", exc)
            return []
        finally:
            client.close()
        return lost

    def alive(self) -> bool:
        with self.lock:
            return self.triton.is_alive()

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def _guard(self, action: Callable, arg: Any) -> None:
        try:
            action(arg)
        except Exception:
            log.exception("triton %s(%s) failed; will retry", action.__name__.strip("_"), getattr(arg, "name", arg))

    def _bind(self, target: TritonTarget) -> None:
        session = ort_session(self.artifact_path(target.artifact), self.ort_threads)
        signature = target.signature or session_signature(session)
        input_names = [s["name"] for s in signature["inputs"]]
        output_names = [s["name"] for s in signature["outputs"]]
        instances = max(1, int(target.batching.get("instances") or 1))
        batched = int(target.batching.get("max_batch_size") or 0) > 0
        self.triton.bind(
            model_name=target.name,
            infer_func=[make_infer_fn(session, input_names, output_names) for _ in range(instances)],
            inputs=tensors(signature["inputs"], batched),
            outputs=tensors(signature["outputs"], batched),
            model_version=TRITON_VERSION,
            config=pytriton_model_config(target.batching),
            strict=False,
        )
        self.bound[target.name] = target.artifact
        log.info("loaded %s (artifact %s, %d instance(s))", target.name, target.artifact[:12], instances)

    def _unbind(self, name: str) -> None:
        """PyTriton (0.7) has no public unbind: do for one model what ModelManager.clean does for all.

        Order matters: the model's observers are cleared (model.clean) before Triton
        unloads it, else the stub shutting down would make PyTriton stop the server.
        """
        import tritonclient.http as httpclient
        from pytriton.client.auth import create_auth_headers

        model = self.triton._model_manager._models.pop((name.lower(), TRITON_VERSION), None)
        self.bound.pop(name, None)
        if model is None:
            return
        model.clean()
        _forget_tensor_store(name)
        headers = create_auth_headers(self.triton.get_access_token(), "http")
        client = httpclient.InferenceServerClient(self.http_url, network_timeout=60.0)
        try:
            client.unload_model(name, headers=headers)
        finally:
            client.close()
        log.info("unloaded %s", name)


def _forget_tensor_store(name: str) -> None:
    """PyTriton keeps one TensorStore client per socket address for the life of the process, with
    the authentication key of the stub it first met. A model bound again under the same name gets
    a new stub with a new key at the same address, and every request then fails with "digest sent
    was rejected" (the M:6 -> M:7 -> M:6 churn). Dropping the cached client makes the next bind
    connect afresh with the new key."""
    try:
        from pytriton.proxy.data import TensorStore
    except ImportError:
        return
    suffix = f"/{name}-data.sock"
    for address in [a for a in list(TensorStore._instances) if str(a).endswith(suffix)]:
        TensorStore._instances.pop(address, None)


def _handle_signals(stop: threading.Event) -> Callable[[], None]:
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


def _serve(stop: threading.Event, binder: ModelBinder) -> bool:
    """Watch the server every second; retry unbound targets now and then. True if Triton died."""
    last_reconcile = time.monotonic()
    while not stop.wait(1.0):
        if not binder.alive():
            return True
        if time.monotonic() - last_reconcile >= RECONCILE_PERIOD_S:
            binder.reconcile()
            last_reconcile = time.monotonic()
    return False


MAX_RESTARTS = 5  # in-process restarts of a dying tritonserver within RESTART_WINDOW_S, then give up
RESTART_WINDOW_S = 60.0


def run_embedded_triton(settings: TritonSettings, stop_event: threading.Event | None = None,
                        *, ort_threads: int | None = None, restart: bool = True) -> None:
    """Serve until ``stop_event`` is set or SIGTERM/SIGINT.

    When tritonserver dies (``kill -9``, a crash) its leftovers are stopped and a new one is
    started in this process at once, with every model the registry deploys bound again: no
    Python start-up to wait for. Raises once it dies ``MAX_RESTARTS`` times in
    ``RESTART_WINDOW_S`` (or at the first death with ``restart=False``), and `serving up`
    starts the whole process again.
    """
    _default_logging()
    stop = stop_event or threading.Event()
    restore_signals = _handle_signals(stop)
    fix_library_path()
    own_process = threading.current_thread() is threading.main_thread() and stop_event is None
    if own_process:  # `serving triton`: the process is ours; an embedding test process is not
        adopt_orphans()
        clean_stale()
    threads = ort_threads or settings.triton_ort_threads or default_ort_threads()
    deaths: list[float] = []
    try:
        while _run_once(settings, stop, threads, own_process):
            now = time.monotonic()
            deaths = [t for t in deaths if now - t < RESTART_WINDOW_S] + [now]
            if not restart or len(deaths) >= MAX_RESTARTS or stop.is_set():
                raise RuntimeError(f"tritonserver exited unexpectedly ({len(deaths)} time(s) "
                                   f"in {RESTART_WINDOW_S:.0f}s)")
            log.warning("tritonserver exited unexpectedly; starting a new one (%d in %.0fs)",
                        len(deaths), RESTART_WINDOW_S)
    finally:
        restore_signals()


def _run_once(settings: TritonSettings, stop: threading.Event, threads: int, own_process: bool) -> bool:
    """One tritonserver's life; True if it died under us."""
    from pytriton.triton import Triton

    # Short, unique path: PyTriton puts unix sockets in it (108-byte limit), and two
    # servers on one box must never share one.
    workspace = Path(tempfile.gettempdir()) / f"{WORKSPACE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    triton = Triton(config=triton_config(settings), workspace=workspace)
    subscriber: ConfigSubscriber | None = None
    binder: ModelBinder | None = None
    died = False
    try:
        triton.run()
        fetcher = ArtifactFetcher(settings.control_plane_url, settings.home / "cache",
                                  shared_dir=settings.resolved_artifact_dir())
        http_url = f"{settings.triton_host}:{settings.triton_http_port}"
        binder = ModelBinder(triton, fetcher.path, threads, http_url)
        subscriber = ConfigSubscriber(settings.control_plane_url, binder.apply,
                                      cache_path=settings.home / "triton-config.json").start()
        log.info("embedded triton ready: grpc %s:%s http %s", settings.triton_host,
                 settings.triton_grpc_port, http_url)
        died = _serve(stop, binder)
    finally:
        if subscriber is not None:
            subscriber.stop()
        if binder is not None:
            binder.close()
        try:
            triton.stop()
        except Exception:  # a dead server may fail to stop cleanly; its processes go below
            log.exception("stopping PyTriton failed")
        if own_process:  # after a crash nothing is worth waiting for: every second is downtime
            n = kill_descendants(grace_s=0.3 if died else 3.0)
            if n:
                log.warning("stopped %d process(es) tritonserver left behind", n)
        shutil.rmtree(workspace, ignore_errors=True)
    return died


def _default_logging() -> None:
    """As a process entry point (CLI), log loads/unloads; leave a host app's logging alone."""
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        logging.getLogger("pytriton").setLevel(logging.WARNING)


def main() -> None:
    run_embedded_triton(TritonSettings())


if __name__ == "__main__":
    main()

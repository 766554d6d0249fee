"""Real TorchServe (the Java frontend and its Python backend workers) for reference answers.

The platform serves TorchServe's ``.mar`` archives at ``/predictions/{name}``, and its answers must
be TorchServe's own. Tests get those from the real thing: :func:`torchserve` starts it on free
loopback ports with a config of ours, lets the test register archives through the management API,
and stops it together with every process it started (Java and each backend worker), even when the
test fails or the start itself does.

Choices this environment needs, and why:

- the ``torchserve`` CLI keeps its pid file in ``tempfile.gettempdir()``, and the workers their Unix
  sockets (``.ts.sock.9000``...); other engineers on the same machine start TorchServe too, so each
  instance gets a private, short ``TMPDIR``/``TEMP`` (which also holds the archives TorchServe
  extracts, and the JVM's temporary files), removed when it stops;
- every port is a free one (``serving.ports``), gRPC's two included: TorchServe cannot turn gRPC off;
- the backend runs ``--python`` = the CLI's own interpreter, the venv's: its shebang, so the CLI is the
  venv's ``torchserve`` script beside :data:`sys.executable`;
- ``import torchvision`` fails in this venv (a CUDA-built wheel beside CPU torch); image handlers import
  it, so the backend's ``PYTHONPATH`` carries a ``sitecustomize.py`` (:data:`SITECUSTOMIZE`) that, in
  backend workers only, makes the first ``import torchvision`` call
  ``serving.torchserve.vision_ops.ensure_torchvision()`` (when that module exists);
- no internet and 2 shared cores: system metrics off, two Netty threads, a small JVM that starts
  with the C1 compiler only.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import httpx
import psutil

from serving.ports import free_port
from tests.support.ci import cannot_run
from tests.support.procs import kill_all

REPO = Path(__file__).resolve().parents[2]
MARKER = "SERVING_TORCHSERVE_REFERENCE"  # in every process of one instance: found even once re-parented
STOP_GRACE_S = 10.0
JVM_ARGS = "-Xmx768m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ActiveProcessorCount=2"

# Runs at the start of every Python process of the instance (the CLI and each backend worker). In
# backend workers only, it routes the first ``import torchvision`` (a handler's, or TorchServe's image
# handlers') through ensure_torchvision(): a worker whose handler never imports torchvision pays nothing
# (importing it eagerly would cost each worker ~1.4 s of CPU). The finder returns a placeholder spec; its
# loader drops the placeholder and lets ensure_torchvision() import the real torchvision, which the
# import system then hands to the importer (it takes what sys.modules holds after exec_module). Where the
# venv already routes torchvision so (scripts/setup.sh's .pth: serving.torchserve.torchvision_hook), this
# finder stays out of the way.
SITECUSTOMIZE = textwrap.dedent('''\
    """Written by tests/support/torchserve.py: in TorchServe's backend workers, the first
    ``import torchvision`` goes through serving.torchserve.vision_ops.ensure_torchvision() when that
    module exists (this venv's torchvision cannot import without it)."""
    import importlib
    import importlib.machinery
    import sys


    class TorchvisionThroughVisionOps:
        def find_spec(self, name, path=None, target=None):
            if name != "torchvision":
                return None
            sys.meta_path.remove(self)  # once: the real import below takes the usual way
            return importlib.machinery.ModuleSpec(name, self)

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            del sys.modules[module.__name__]  # the placeholder: the real torchvision takes its place
            try:
                from serving.torchserve.vision_ops import ensure_torchvision
            except ModuleNotFoundError as exc:
                if not (exc.name or "").startswith("serving"):
                    raise
                importlib.import_module("torchvision")
            else:
                ensure_torchvision()


    # serving.torchserve.torchvision_hook (a .pth of the venv, imported before this file) does the same
    # for every process; with it, this finder stays out (both calling ensure_torchvision would deadlock)
    if (any(arg.endswith("model_service_worker.py") for arg in getattr(sys, "orig_argv", sys.argv))
            and "serving.torchserve.torchvision_hook" not in sys.modules):
        sys.meta_path.insert(0, TorchvisionThroughVisionOps())
''')


class TorchServeError(RuntimeError):
    """TorchServe did not start, or the management API refused a request; carries its log tail."""


@dataclass
class TorchServe:
    """A running instance: its three base URLs, folders, and the management calls tests need."""

    inference_url: str
    management_url: str
    metrics_url: str
    home: Path
    model_store: Path
    log_dir: Path
    process: subprocess.Popen
    marker: str
    start_s: float = 0.0
    registered: dict[str, float] = field(default_factory=dict)  # model name -> seconds its registration took
    killed: list[str] | None = None  # once stopped: the processes that needed SIGKILL (empty: a clean stop)

    def predictions_url(self, name: str, version: str | None = None) -> str:
        """TorchServe's inference URL of a model (``/predictions/{name}[/{version}]``)."""
        return f"{self.inference_url}/predictions/{name}" + (f"/{version}" if version else "")

    def register(self, mar: Path, name: str | None = None, *, initial_workers: int = 1,
                 batch_size: int | None = None, max_batch_delay_ms: int | None = None,
                 response_timeout_s: int | None = None, timeout_s: float = 180.0) -> dict:
        """Register ``mar`` synchronously (its workers are up when this returns) and return the
        management API's JSON answer. The archive is copied into the model store: TorchServe takes a
        local ``url`` only as a file name there. Batch settings left out are the archive's own
        (``model-config.yaml``) or TorchServe's defaults."""
        target = self.model_store / mar.name
        if not target.exists():
            shutil.copyfile(mar, target)
        params: dict[str, str | int] = {"url": mar.name, "initial_workers": initial_workers, "synchronous": "true"}
        optional = {"model_name": name, "batch_size": batch_size, "max_batch_delay": max_batch_delay_ms,
                    "response_timeout": response_timeout_s}
        params.update({key: value for key, value in optional.items() if value is not None})
        started = time.monotonic()
        answer = httpx.post(f"{self.management_url}/models", params=params, timeout=timeout_s)
        if answer.status_code != 200:
            raise TorchServeError(f"registering {mar.name} answered {answer.status_code}: {answer.text}\n"
                                  f"{self.log_tail()}")
        self.registered[name or mar.stem] = time.monotonic() - started
        return answer.json()

    def unregister(self, name: str, timeout_s: float = 60.0) -> None:
        """Unregister a model, stopping its workers (frees a backend process's memory)."""
        answer = httpx.delete(f"{self.management_url}/models/{name}", timeout=timeout_s)
        if answer.status_code != 200:
            raise TorchServeError(f"unregistering {name} answered {answer.status_code}: {answer.text}")

    def describe(self, name: str) -> list[dict]:
        """The management API's description of a model (one entry per version)."""
        answer = httpx.get(f"{self.management_url}/models/{name}", timeout=30.0)
        answer.raise_for_status()
        return answer.json()

    def worker_pids(self, name: str) -> list[int]:
        """Backend worker pids of a model, as the management API reports them."""
        return [worker["pid"] for entry in self.describe(name) for worker in entry.get("workers", [])
                if worker.get("pid")]

    def log_tail(self, chars: int = 12000) -> str:
        """The end of each log file the instance wrote (CLI output, ts_log, model_log)."""
        parts = []
        for log in ("torchserve.out", "ts_log.log", "model_log.log"):
            path = self.log_dir / log
            if path.is_file():
                text = path.read_text(errors="replace")
                parts.append(f"----- {path} (last {min(chars, len(text))} of {len(text)} chars) -----\n"
                             f"{text[-chars:]}")
        return "\n".join(parts) or f"(no logs in {self.log_dir})"

    def processes(self) -> list[psutil.Process]:
        """Every live process of this instance: descendants of the CLI, and any re-parented one
        that carries the instance's marker in its environment."""
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.process.pid)
            found[root.pid] = root
            found.update({child.pid: child for child in root.children(recursive=True)})
        except psutil.NoSuchProcess:
            pass
        needle = f"{MARKER}={self.marker}".encode()
        for pid in psutil.pids():
            if pid in found or pid == os.getpid():
                continue
            try:
                if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found[pid] = psutil.Process(pid)
            except (OSError, psutil.Error):
                continue
        return list(found.values())


def _require_tools() -> tuple[str, Path]:
    """``java`` on PATH and the venv's ``torchserve`` CLI, or the suite's rule for a missing tool."""
    java = shutil.which("java")
    if java is None:
        cannot_run("TorchServe's frontend needs `java` (17+) on PATH")
    cli = Path(sys.executable).parent / "torchserve"
    if not cli.is_file():
        cannot_run(f"no torchserve CLI beside {sys.executable}: install the `torch` extra (`make setup`)")
    return java, cli


def write_config(path: Path, *, ports: Mapping[str, int], model_store: Path, workers: int,
                 extra: Mapping[str, str] | None = None) -> None:
    """TorchServe's config.properties: loopback addresses on our ports, nothing installed per model,
    Prometheus metrics, few threads."""
    settings = {
        "inference_address": f"http://127.0.0.1:{ports['inference']}",
        "management_address": f"http://127.0.0.1:{ports['management']}",
        "metrics_address": f"http://127.0.0.1:{ports['metrics']}",
        # gRPC cannot be turned off; left alone it binds 7070/7071, which another instance may hold
        "grpc_inference_address": "127.0.0.1",
        "grpc_inference_port": str(ports["grpc_inference"]),
        "grpc_management_address": "127.0.0.1",
        "grpc_management_port": str(ports["grpc_management"]),
        "model_store": str(model_store),
        "default_workers_per_model": str(workers),
        "install_py_dep_per_model": "false",
        "metrics_mode": "prometheus",
        "disable_system_metrics": "true",
        "number_of_netty_threads": "2",
        "netty_client_threads": "2",
        "enable_envvars_config": "false",
        "vmargs": JVM_ARGS,
        **(extra or {}),
    }
    path.write_text("".join(f"{key}={value}\n" for key, value in settings.items()))


def _environment(tmp: Path, hook: Path, logs: Path, marker: str) -> dict[str, str]:
    """The instance's environment: private temp folder, logs under ``home``, the sitecustomize hook and
    the repository (for ``serving.torchserve.vision_ops``) on the backend's ``PYTHONPATH``."""
    python_path = [str(hook), str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp), "TMP": str(tmp),
           "LOG_LOCATION": str(logs), "METRICS_LOCATION": str(logs), "PYTHONPATH": os.pathsep.join(python_path),
           "TS_DISABLE_SYSTEM_METRICS": "true", MARKER: marker}
    env.pop("TS_CONFIG_FILE", None)  # the CLI would prefer it over --ts-config
    env.pop("JAVA_HOME", None)  # the CLI would take $JAVA_HOME/bin/java over `java` on PATH
    return env


def _wait_ready(server: TorchServe, timeout_s: float) -> None:
    """Poll ``/ping`` until TorchServe says Healthy; fail early, with its logs, if the CLI exited."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise TorchServeError(f"torchserve exited with {server.process.returncode} before /ping answered\n"
                                  f"{server.log_tail()}")
        try:
            answer = httpx.get(f"{server.inference_url}/ping", timeout=2.0)
            if answer.status_code == 200:
                return
            last = f"{answer.status_code} {answer.text}"
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise TorchServeError(f"/ping did not answer 200 within {timeout_s}s: last {last!r}\n{server.log_tail()}")


def stop(server: TorchServe, grace_s: float = STOP_GRACE_S) -> list[str]:
    """Stop the instance: SIGTERM to the JVM (its shutdown stops the workers) and to the CLI, SIGKILL
    to whatever is still alive after ``grace_s``. Returns the processes that needed SIGKILL (empty when
    TorchServe stopped cleanly); raises if any survives even that."""
    procs = server.processes()
    for proc in procs:
        try:
            if proc.name() == "java" or proc.pid == server.process.pid:
                proc.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    alive += [p for p in server.processes() if p not in alive]  # a worker started while stopping
    killed = kill_all(alive)
    _, survivors = psutil.wait_procs(alive, timeout=5.0)
    if server.process.poll() is None:
        server.process.wait(5.0)
    if survivors or server.processes():
        raise TorchServeError(f"TorchServe processes survived SIGKILL: {survivors or server.processes()}")
    return killed


@contextmanager
def torchserve(home: Path, *, workers: int = 1, extra_config: Mapping[str, str] | None = None,
               start_timeout_s: float = 120.0) -> Iterator[TorchServe]:
    """Start real TorchServe under ``home`` (a test's tmp path: model store, logs, config, temp files),
    wait for ``/ping``, yield it, and always stop it and every process it started. Its logs are
    printed when the body (or the start) raises; ``extra_config`` adds or overrides config.properties
    keys (e.g. ``{"service_envelope": "body"}``)."""
    _, cli = _require_tools()
    home.mkdir(parents=True, exist_ok=True)
    model_store, logs, hook = home / "model-store", home / "logs", home / "hook"
    for folder in (model_store, logs, hook):
        folder.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    ports = {name: free_port() for name in ("inference", "management", "metrics", "grpc_inference", "grpc_management")}
    config = home / "config.properties"
    write_config(config, ports=ports, model_store=model_store, workers=workers, extra=extra_config)
    marker = uuid.uuid4().hex
    # TorchServe's workers listen on Unix sockets in the temp folder ({tmp}/.ts.sock.9000): a test's tmp
    # path can be too long for one (108 bytes), so the temp folder is a short one of the system's
    tmp = Path(tempfile.mkdtemp(prefix="torchserve-"))
    (home / "temp-folder.txt").write_text(f"{tmp}\n")
    command = [str(cli), "--start", "--foreground", "--ncs", "--disable-token-auth", "--enable-model-api",
               "--ts-config", str(config), "--model-store", str(model_store)]
    started = time.monotonic()
    with open(logs / "torchserve.out", "ab") as out:
        try:
            process = subprocess.Popen(command, cwd=home, env=_environment(tmp, hook, logs, marker),
                                       stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    server = TorchServe(inference_url=f"http://127.0.0.1:{ports['inference']}",
                        management_url=f"http://127.0.0.1:{ports['management']}",
                        metrics_url=f"http://127.0.0.1:{ports['metrics']}",
                        home=home, model_store=model_store, log_dir=logs, process=process, marker=marker)
    try:
        _wait_ready(server, start_timeout_s)
        server.start_s = time.monotonic() - started
        yield server
    except Exception:
        print(server.log_tail(), file=sys.stderr)
        raise
    finally:
        try:
            server.killed = stop(server)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

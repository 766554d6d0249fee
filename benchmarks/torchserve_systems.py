"""The systems of the TorchServe benchmark, started as their users start them, each configuration an
HTTP endpoint taking ``curl -T``'s raw PUT at ``/predictions/{name}``:

- ``torchserve``: real TorchServe (the ``torchserve`` package with Debian's OpenJDK), started by the
  test suite's harness (tests/support/torchserve.py: free ports, private temp folder, every process
  stopped), with the JVM's own defaults rather than the harness's quick-start flags (C1 only, a
  small heap), so its frontend runs as a TorchServe user's does. Each configuration is the archive
  registered under its own model name with ``initial_workers`` and ``batch_size``/``max_batch_delay``,
  one JVM for all of them;
- ``torchserve-1thread``: the same with ``OMP_NUM_THREADS=1`` in its environment, which TorchServe's
  backend workers inherit (TorchServe's performance guide: cores divided by workers), so that a
  finding about torch's threads is not a finding about a default only one side kept;
- ``platform`` / ``platform-onnx``: ``serving up --workers P`` (no embedded Triton or LLM launcher:
  a TorchServe archive needs neither), ``serving model upload --path X.mar``, ``serving model add
  --engine torchserve --aux-config workers=H batch_size=B max_batch_delay=D [runtime=onnx] --wait``,
  one endpoint per configuration, one stack per worker-process count.

A :class:`Variant` is one configuration: its URL, its settings in words and numbers, and its
system's processes, whose CPU time is the system's.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
from unittest import mock

import httpx
import psutil

from benchmarks.procs import child_env, process, wait_http
from benchmarks.torchserve_archives import Workload

BATCH_DELAY_MS = 5  # max_batch_delay of the batched configurations (the issue: 5-10 ms)
TORCHSERVE_GRID = ((1, 1), (1, 8), (2, 1), (2, 8))  # (backend workers, batch size)
TORCHSERVE_1THREAD_GRID = ((2, 1), (2, 8))  # one thread each only matters with a worker per core
# (worker processes, handler processes in each, batch size); 2 x 2 handler processes would put four
# torch processes on two cores
PLATFORM_GRID = tuple((p, h, b) for p, h in ((1, 1), (1, 2), (2, 1)) for b in (1, 8))
CLI_AUX_BUG = "is not a field of config.pbtxt"  # serving model add --engine torchserve --aux-config: see add()


@dataclass(frozen=True)
class Variant:
    """One configuration of one system, ready for load."""

    system: str
    id: str  # e.g. w2-b8 (TorchServe), p1-h2-b8 (platform)
    label: str
    url: str
    settings: dict
    processes: Callable[[], list[psutil.Process]] = field(compare=False, repr=False)


def grid_id(system: str, values: tuple[int, ...]) -> str:
    if system.startswith("torchserve"):
        workers, batch = values
        return f"w{workers}-b{batch}"
    processes, handlers, batch = values
    return f"p{processes}-h{handlers}-b{batch}"


def batch_words(batch: int) -> str:
    return f"batch {batch} ({BATCH_DELAY_MS} ms)" if batch > 1 else "batch 1"


def tree(root: int) -> list[psutil.Process]:
    """``root`` and every descendant now alive."""
    try:
        proc = psutil.Process(root)
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def role(proc: psutil.Process) -> str:
    """Which part of a system a process is, from its command line: where each system's CPU goes."""
    try:
        line = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    rules = (("java", "frontend (Java)"), ("model_service_worker", "backend workers"),
             ("bin/torchserve", "torchserve CLI"), ("serving.torchserve.handler_process", "handler processes"),
             ("control-plane", "control plane"), ("statistics", "statistics"), (" worker", "workers"),
             ("multiprocessing", "workers"), (" up ", "supervisor"))
    return next((name for needle, name in rules if needle in line), "other")


# --- TorchServe ---------------------------------------------------------------------------------------

def java_and_cli() -> str | None:
    """Why TorchServe cannot run here, or None (the harness itself would skip a test instead)."""
    if shutil.which("java") is None:
        return "no `java` on PATH (Debian's openjdk-17-jre-headless)"
    if not (Path(sys.executable).parent / "torchserve").is_file():
        return f"no torchserve CLI beside {sys.executable} (the torch extra: make setup)"
    return None


@contextmanager
def torchserve(workload: Workload, home: Path, system: str = "torchserve",
               variants: set[str] | None = None) -> Iterator[list[Variant]]:
    """One TorchServe with the archive registered once per configuration of its grid."""
    from tests.support.torchserve import torchserve as start

    one_thread = system == "torchserve-1thread"
    grid = TORCHSERVE_1THREAD_GRID if one_thread else TORCHSERVE_GRID
    env = {"OMP_NUM_THREADS": "1"} if one_thread else {}
    shutil.rmtree(home, ignore_errors=True)
    with ExitStack() as stack:
        # the harness starts TorchServe with this process's environment, which its backend workers inherit:
        # changed only while it starts (the caller starts nothing else meanwhile); vmargs empty: the JVM's
        # own defaults
        with mock.patch.dict(os.environ, env):
            server = stack.enter_context(start(home, extra_config={"vmargs": ""}, start_timeout_s=300))
        found = []
        for workers, batch in grid:
            vid = grid_id(system, (workers, batch))
            if variants and vid not in variants:
                continue
            name = f"{workload.name}-{vid}"
            server.register(workload.mar, name, initial_workers=workers, batch_size=batch,
                            max_batch_delay_ms=BATCH_DELAY_MS if batch > 1 else None, timeout_s=600)
            threads = " x 1 thread" if one_thread else ""
            found.append(Variant(system, vid, f"{workers} worker{'s' if workers > 1 else ''}{threads}, "
                                 f"{batch_words(batch)}", server.predictions_url(name),
                                 {"workers": workers, "batch_size": batch,
                                  "max_batch_delay_ms": BATCH_DELAY_MS if batch > 1 else None,
                                  "omp_num_threads": 1 if one_thread else None},
                                 server.processes))
        yield found


# --- the platform -------------------------------------------------------------------------------------

def cli(env: dict, *args: str, timeout: float = 900) -> str:
    out = subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=child_env(env), capture_output=True,
                         text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"serving {' '.join(args)} failed: {out.stdout[-1500:]}{out.stderr[-1500:]}")
    return out.stdout


def stack_env(home: Path) -> dict:
    """Fresh state and free ports (the demo's recipe); the user's own tokens never reach this stack."""
    from serving.demo import stack_env as demo_env

    shutil.rmtree(home, ignore_errors=True)
    env = {k: v for k, v in demo_env(home).items() if k.startswith("SERVING_")}
    env.update(dict.fromkeys(("SERVING_TOKEN", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN")))
    return env


def onnx_option() -> str | None:
    """Why engine option ``runtime=onnx`` cannot be used, or None (serving/torchserve/options.py has it)."""
    from serving.torchserve import options

    known = {*options.OPTIONS, *getattr(options, "CHOICES", {})}
    return None if "runtime" in known else "engine option runtime is not in serving/torchserve/options.py yet"


def wait_answering(url: str, body: bytes, procs: list[subprocess.Popen], timeout: float = 600,
                   streak: int = 8) -> None:
    """Until ``streak`` PUTs in a row answer 200: with several worker processes each must have loaded it."""
    deadline, ok, last = time.monotonic() + timeout, 0, None
    while ok < streak:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not answering after {timeout:.0f} s (last: {last})")
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("serving up exited; see its log")
        try:
            answer = httpx.put(url, content=body, timeout=120)
            ok, last = (ok + 1, None) if answer.status_code == 200 else (0, f"{answer.status_code} {answer.text[:200]}")
        except httpx.HTTPError as exc:
            ok, last = 0, repr(exc)
        if not ok:
            time.sleep(0.3)


def add(env: dict, endpoint: str, model: str, options: dict[str, str | int]) -> str | None:
    """``serving model add --engine torchserve --aux-config ... --wait``; what went wrong in the CLI, if
    anything the benchmark works around. Known: after the control plane accepted the endpoint, the CLI
    reads the pairs once more as Triton's config.pbtxt keys to print notes and fails on ``workers`` and
    the other TorchServe options (serving/cli/models.py ``aux_notes``), before ``--wait``; and without
    ``--engine torchserve`` the control plane refuses them the same way (registry/schemas.py validates
    aux_config before the archive's engine is known). The caller then waits for answers itself."""
    pairs = [f"{key}={value}" for key, value in options.items()]
    try:
        cli(env, "model", "add", "--endpoint", endpoint, "--model", model, "--engine", "torchserve",
            "--aux-config", *pairs, "--wait")
    except RuntimeError as exc:
        if CLI_AUX_BUG not in str(exc):
            raise
        return "serving model add printed a traceback after the endpoint was created (aux_notes); waited here"
    return None


def endpoint_options(env: dict) -> dict[str, dict]:
    """Each endpoint's engine options as the control plane holds them: proof the settings applied."""
    listed = json.loads(cli(env, "endpoint", "list", "--json"))
    return {ep["name"]: ep.get("engine_options") or {} for ep in listed}


@contextmanager
def platform(workload: Workload, home: Path, log: Path, processes: int, systems: set[str],
             variants: set[str] | None = None) -> Iterator[list[Variant]]:
    """One ``serving up --workers N`` with an endpoint per configuration of this worker-process count
    (and per runtime: ``platform`` the handler as it is, ``platform-onnx`` with ``runtime=onnx``)."""
    env = stack_env(home)
    worker = f"http://127.0.0.1:{env['SERVING_WORKER_PORT']}"
    body = next(iter(workload.inputs.values()))
    args = ["-m", "serving.cli.main", "up", "--workers", str(processes), "--no-triton", "--no-llm"]
    with process(args, log, env=env) as proc:
        wait_http(f"{worker}/v2/health/live", timeout=300, procs=[proc])
        cli(env, "model", "upload", "--name", workload.name, "--path", str(workload.mar))
        wanted = []
        for system in ("platform", "platform-onnx"):
            for values in PLATFORM_GRID:
                vid = grid_id(system, values)
                if system in systems and values[0] == processes and (not variants or vid in variants):
                    wanted.append((system, vid, values))
        found, notes = [], {}
        for system, vid, (p, handlers, batch) in wanted:
            options: dict[str, str | int] = {"workers": handlers, "batch_size": batch}
            if batch > 1:
                options["max_batch_delay"] = BATCH_DELAY_MS
            if system == "platform-onnx":
                options["runtime"] = "onnx"
            endpoint = f"{workload.name}-{system.removeprefix('platform').strip('-') or 'handler'}-{vid}"
            note = add(env, endpoint, workload.name, options)
            url = f"{worker}/predictions/{endpoint}"
            wait_answering(url, body, [proc], streak=8 * p)
            if note:
                notes[endpoint] = note
            runtime = ", onnxruntime" if system == "platform-onnx" else ""
            found.append(Variant(system, vid, f"{p} worker process{'es' if p > 1 else ''} x {handlers} handler "
                                 f"process{'es' if handlers > 1 else ''}, {batch_words(batch)}{runtime}", url,
                                 {"worker_processes": p, "handler_processes": handlers, "batch_size": batch,
                                  "max_batch_delay_ms": BATCH_DELAY_MS if batch > 1 else None, "endpoint": endpoint,
                                  "aux_config": options}, lambda pid=proc.pid: tree(pid)))
        applied = endpoint_options(env)
        for variant in found:
            have = applied.get(variant.settings["endpoint"], {})
            wrong = {k: v for k, v in variant.settings["aux_config"].items() if str(have.get(k)) != str(v)}
            if wrong:
                raise RuntimeError(f"{variant.settings['endpoint']}: engine options {have}, wanted {wrong}")
            if variant.settings["endpoint"] in notes:
                variant.settings["cli_note"] = notes[variant.settings["endpoint"]]
        yield found

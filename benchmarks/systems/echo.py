"""W0, the no-op workload: every system serves an echo, so only the serving path is measured.

- ``platform-echo-{1w,2w}``: this platform as a user runs it (``serving up``, statistics on), a
  model-less ``custom`` endpoint whose ``preprocess.py`` returns its input
  (``echo_servers/platform_preprocess.py``): routing, user code, statistics, all of it.
- ``litserve``, ``mlserver``, ``bentoml``: the same echo in each, with its defaults, installed by
  the benchmark into its own virtual environment (``python -m venv`` under
  ``benchmarks/.cache/venvs/<name>``, ``pip install <name>`` from PyPI) the first time; where that
  fails the system is reported unavailable with pip's last line, and the run goes on.

LitServe and BentoML take ``{"text": ...}`` as the platform does; MLServer's standard path is the
Open Inference Protocol, so its clients send the text as one BYTES input (``triton_v2_text``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from benchmarks.procs import free_port, process, stop, wait_http
from benchmarks.systems import platform
from benchmarks.systems.base import RunContext, System, Target, Unavailable
from benchmarks.workloads import CACHE_DIR

SERVERS = Path(__file__).resolve().parent / "echo_servers"
VENVS = CACHE_DIR / "venvs"
WORKLOAD = "W0"
# echo-1w-keys: the same as echo-1w with client keys required, and a key scoped to the endpoint with a
# rate it never reaches (every part of the check runs): the check's cost is the ratio of the two
PLATFORM_STACKS = (platform.Stack("echo-1w", 1, True, ()), platform.Stack("echo-1w-keys", 1, True, (), client_keys=True),
                   platform.Stack("echo-2w", 2, True, ()))


# --- the platform -------------------------------------------------------------------------------
def platform_targets(ctx: RunContext) -> Iterator[Target]:
    for stack in PLATFORM_STACKS:
        variant = f"platform-{stack.suffix}"
        if not ctx.wants(variant):
            continue
        env = platform.stack_env(ctx, stack)
        worker = f"http://127.0.0.1:{env['SERVING_WORKER_PORT']}"
        with process(["-m", "serving.cli.main", "up", "--workers", str(stack.workers)],
                     ctx.log_dir / f"platform-{stack.suffix}.log", env=env) as proc:
            wait_http(f"{worker}/v2/health/live", timeout=240, procs=[proc])
            platform.cli(env, "model", "add", "--endpoint", "echo", "--engine", "custom",
                         "--preprocess", str(SERVERS / "platform_preprocess.py"))
            url = f"{worker}/serve/echo"
            headers = client_key_header(env) if stack.client_keys else {}
            platform.wait_serving(url, {"text": "warm up"}, timeout=180, procs=[proc], headers=headers)
            workers = f"{stack.workers} worker{'s' if stack.workers > 1 else ''}"
            keys = ", client keys required" if stack.client_keys else ""
            yield Target(variant, f"platform, {workers}, custom endpoint echoing its input, statistics on{keys}", url,
                         "text_json", procs=[proc], headers=headers,
                         details={"workers": stack.workers, "statistics": True, "client_keys": stack.client_keys})


def client_key_header(env: dict[str, str | None]) -> dict[str, str]:
    key = platform.cli(env, "key", "create", "--name", "bench", "--endpoints", "echo", "--rate", "1000000",
                       "--burst", "1000000").strip()
    return {"Authorization": f"Bearer {key}"}


# --- the others, each in its own virtual environment -----------------------------------------------
def venv_python(name: str, packages: list[str], log: Path) -> Path:
    """``benchmarks/.cache/venvs/<name>/bin/python`` with ``packages`` installed (once: a marker file
    records what was installed); Unavailable with pip's words when it cannot be done."""
    root = VENVS / name
    python, marker = root / "bin" / "python", root / ".installed"
    if marker.exists() and marker.read_text() == " ".join(packages) and python.exists():
        return python
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
        with open(log, "ab") as out:
            done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", *packages],
                                  stdout=out, stderr=subprocess.STDOUT, timeout=1800)
    except (subprocess.SubprocessError, OSError) as exc:
        raise Unavailable(f"{name}: could not create its virtual environment: {exc}") from None
    if done.returncode != 0:
        last = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip() and "WARNING" not in ln]
        raise Unavailable(f"{name}: pip install {' '.join(packages)} failed ({last[-1][:200] if last else 'no output'});"
                          f" see {log}")
    marker.write_text(" ".join(packages))
    return python


@dataclass(frozen=True)
class Other:
    name: str
    packages: list[str]
    label: str
    payload: str
    path: str            # the echo's URL path
    health: str          # a GET that answers 2xx once the echo serves
    command: Callable[[Path, int], list[str]]   # (venv python, port) -> argv
    env: Callable[[int], dict[str, str]] = lambda port: {}


def _bin(python: Path, tool: str) -> str:
    return str(python.with_name(tool))


OTHERS = (
    Other("litserve", ["litserve", "uvloop", "httptools"], "LitServe, defaults (API server + 1 inference worker process)", "text_json",
          "/predict", "/health", lambda py, port: [str(py), str(SERVERS / "litserve_echo.py"), str(port)]),
    # MLServer 1.7's inference workers call asyncio.get_event_loop() with no loop set, which uvloop
    # 0.23 refuses ("There is no current event loop"): they die at start. An older uvloop lets them run.
    Other("mlserver", ["mlserver", "uvloop<0.22", "httptools"], "MLServer, defaults, custom runtime, Open Inference Protocol", "triton_v2_text",
          "/v2/models/echo/infer", "/v2/models/echo/ready",
          lambda py, port: [_bin(py, "mlserver"), "start", str(SERVERS / "mlserver_echo")],
          lambda port: {"MLSERVER_HTTP_PORT": str(port), "MLSERVER_GRPC_PORT": str(free_port()),
                        "MLSERVER_METRICS_PORT": str(free_port()), "MLSERVER_DEBUG": "false"}),
    Other("bentoml", ["bentoml", "uvloop", "httptools"], "BentoML, defaults (bentoml serve, one service)", "text_json", "/echo", "/readyz",
          lambda py, port: [_bin(py, "bentoml"), "serve", "bentoml_echo:Echo", "--port", str(port),
                            "--host", "127.0.0.1", "--working-dir", str(SERVERS)],
          lambda port: {"BENTOML_DO_NOT_TRACK": "true", "BENTOML_HOME": str(VENVS / "bentoml-home")}),
)


def other_targets(other: Other) -> Callable[[RunContext], Iterator[Target]]:
    def targets(ctx: RunContext) -> Iterator[Target]:
        python = venv_python(other.name, other.packages,
                             ctx.log_dir / f"{other.name}-install.log")
        port = free_port()
        env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **other.env(port),
               "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        log = ctx.log_dir / f"{other.name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            proc = subprocess.Popen(other.command(python, port), cwd=SERVERS, env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_http(f"http://127.0.0.1:{port}{other.health}", timeout=180, procs=[proc])
            time.sleep(1.0)  # workers behind the API server (LitServe) come up just after it answers
            yield Target(other.name, other.label, f"http://127.0.0.1:{port}{other.path}", other.payload,
                         procs=[proc], details={"packages": other.packages})
        finally:
            stop(proc)

    return targets


PLATFORM = System("platform-echo", "this platform: a model-less custom endpoint echoing its input, statistics on",
                  variants=tuple(f"platform-{s.suffix}" for s in PLATFORM_STACKS), targets=platform_targets,
                  workloads=(WORKLOAD,))
SYSTEMS = (PLATFORM, *(System(o.name, o.label, variants=(o.name,), targets=other_targets(o), workloads=(WORKLOAD,))
                       for o in OTHERS))

"""One vLLM OpenAI server: which engines a snapshot asks for, the folder it serves, its command line.

An engine is keyed by model version and launch options (serving/llm/naming.py; the key is also its
``--served-model-name``): endpoints serving the same version with equal options share it, and one with
other options gets an engine of its own. Endpoints whose options name a ``url`` use an external engine
and start nothing here.
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.llm.naming import engine_key
from serving.supervisor import _die_with_parent

VLLM_MODULE = "vllm.entrypoints.openai.api_server"  # the `vllm` console script looks up a distribution named vllm
GIB = 1 << 30
OPTION_FLAGS = {"dtype": "--dtype", "max_model_len": "--max-model-len",
                "tensor_parallel_size": "--tensor-parallel-size", "gpu_memory_utilization": "--gpu-memory-utilization"}


@dataclass(frozen=True)
class EngineSpec:
    key: str                 # naming.engine_key: "<model>:<version>[@<options hash>]", its served model name
    artifact: str            # sha256 of the uploaded folder (a tar)
    options: dict[str, Any] = field(default_factory=dict, hash=False)  # the endpoint's engine_options


def wanted_engines(snapshot: dict[str, Any]) -> dict[str, EngineSpec]:
    """The engines the platform starts for this snapshot: every target (stable, canary, shadow) of a
    ``vllm`` endpoint without ``url``, once per model version and set of launch options."""
    wanted: dict[str, EngineSpec] = {}
    endpoints = snapshot.get("endpoints") or {}
    for name in sorted(endpoints):
        ep = endpoints[name]
        options = ep.get("engine_options") or {}
        if ep.get("engine") != "vllm" or options.get("url"):
            continue
        for t in ep.get("targets") or []:
            key = engine_key(t["model"], int(t["version"]), options)
            wanted.setdefault(key, EngineSpec(key, t["artifact"], dict(options)))
    return wanted


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def vllm_command(python: Path, spec: EngineSpec, model_dir: Path, port: int, kv_cache_gb: float) -> list[str]:
    """vLLM's OpenAI server on 127.0.0.1:port for this engine; options map onto vLLM's own flags."""
    opts = spec.options
    cmd = [str(python), "-m", VLLM_MODULE, "--model", str(model_dir), "--served-model-name", spec.key,
           "--host", "127.0.0.1", "--port", str(port)]
    for key, flag in OPTION_FLAGS.items():
        if opts.get(key) is not None:
            cmd += [flag, str(opts[key])]
    kv_gb = opts.get("kv_cache_space_gb")
    if kv_gb is None and opts.get("gpu_memory_utilization") is None:
        kv_gb = kv_cache_gb  # the platform's default; a GPU fraction, when given, sizes the cache instead
    if kv_gb:
        cmd += ["--kv-cache-memory-bytes", str(int(float(kv_gb) * GIB))]
    return cmd + list(opts.get("extra_args") or [])


def start_engine(command: list[str], log_path: Path) -> subprocess.Popen:
    """In a process group of its own (its EngineCore child goes with it), SIGTERM should the launcher die."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the legacy variable would override --kv-cache-memory-bytes
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                preexec_fn=_die_with_parent, stdin=subprocess.DEVNULL)


# an error line: vLLM's own log at ERROR level, a traceback's last line, argparse's complaint
_ERROR_LINE = re.compile(r"\bERROR\b|^[\w.]*(Error|Exception)(: |$)|: error: ")


def last_error(log_path: Path, since: int = 0, limit: int = 400) -> str | None:
    """The engine's own last word on why it stopped: the last error line its log got after byte ``since``."""
    try:
        with open(log_path, "rb") as f:
            f.seek(max(since, f.seek(0, os.SEEK_END) - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        text = line.strip()
        if _ERROR_LINE.search(text):
            return text[-limit:]
    return None


def log_size(log_path: Path) -> int:
    try:
        return log_path.stat().st_size
    except OSError:
        return 0


def shm_segments(pid: int) -> set[str]:
    """The /dev/shm segments an engine's processes map (vLLM's message queues): a process killed with
    ``kill -9`` never unlinks its own, so the launcher does it for them."""
    import psutil

    found: set[str] = set()
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return found
    inodes: set[int] = set()
    for proc in procs:
        try:
            found |= {m.path for m in proc.memory_maps() if m.path.startswith("/dev/shm/")}
            inodes |= {int(line.split()[4]) for line in Path(f"/proc/{proc.pid}/maps").read_text().splitlines()
                       if "/dev/shm/" in line}
        except (psutil.Error, OSError, ValueError, IndexError):
            pass
    # a POSIX semaphore (multiprocessing's locks) is mapped under a temporary name that is already gone
    # ("sem.XXXXXX (deleted)"): its real name (sem.mp-...) is found by its inode
    try:
        found |= {str(entry) for entry in Path("/dev/shm").iterdir() if entry.stat().st_ino in inodes}
    except OSError:
        pass
    return found


def remove_segments(paths: set[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass

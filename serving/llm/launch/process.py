"""One vLLM OpenAI server: which engines a snapshot asks for, the folder it serves, its command line.

An engine is keyed by model version and launch options (serving/llm/naming.py; the key is also its
``--served-model-name``): endpoints serving the same version with equal options share it, and one with
other options gets an engine of its own. Endpoints whose options name a ``url`` use an external engine
and start nothing here.
"""
from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving.llm.adapters.peft import DEFAULT_MAX_LORAS, engine_rank
from serving.llm.naming import LLM_ENGINES, adapter_name, launch_options, lora_base, replica_count, target_engine
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
    replicas: int = field(default=1, compare=False)  # how many run: changing it restarts none of them
    lora: tuple[int, int] | None = None  # (--max-lora-rank, --max-loras) when LoRA adapters run in it
    adapters: dict[str, str] = field(default_factory=dict, compare=False, hash=False)  # adapter name -> artifact

    def same_engine(self, other: "EngineSpec") -> bool:
        """What each replica computes is unchanged (their number, and the adapters loaded, may differ)."""
        return (self.key, self.artifact, launch_options(self.options), self.lora) == \
            (other.key, other.artifact, launch_options(other.options), other.lora)


@dataclass
class _Wanted:
    artifact: str
    options: dict[str, Any]
    replicas: int = 1
    adapters: dict[str, str] = field(default_factory=dict)
    ranks: list[int] = field(default_factory=list)       # the adapters' ranks
    asked_ranks: list[int] = field(default_factory=list)  # the endpoints' max_lora_rank
    max_loras: list[int] = field(default_factory=list)
    lora_asked: bool = False                             # an endpoint named max_lora_rank or max_loras
    idle_after: list[int | None] = field(default_factory=list)  # each sharing target's scale_to_zero_after_s


def wanted_engines(snapshot: dict[str, Any]) -> dict[str, EngineSpec]:
    """The engines the platform starts for this snapshot: every target (stable, canary, shadow) of a
    ``vllm`` endpoint without ``url``, once per model version and set of launch options, with the most
    replicas any of the endpoints sharing it asks for. A LoRA adapter's target runs in its base's
    engine, which then runs with LoRA enabled (:func:`lora_flags`)."""
    wanted: dict[str, _Wanted] = {}
    endpoints = snapshot.get("endpoints") or {}
    for name in sorted(endpoints):
        ep = endpoints[name]
        options = ep.get("engine_options") or {}
        if ep.get("engine") not in LLM_ENGINES or options.get("url"):
            continue
        for t in ep.get("targets") or []:
            base = lora_base(t.get("signature"))
            key = target_engine(t["model"], int(t["version"]), t.get("signature"), options)
            w = wanted.setdefault(key, _Wanted(str(base["artifact"]) if base else t["artifact"], dict(options)))
            w.replicas = max(w.replicas, replica_count(options))
            w.idle_after.append(options.get("scale_to_zero_after_s"))
            if options.get("max_lora_rank") or options.get("max_loras"):
                w.lora_asked = True
                w.asked_ranks += [int(options["max_lora_rank"])] if options.get("max_lora_rank") else []
                w.max_loras += [int(options["max_loras"])] if options.get("max_loras") else []
            if base is not None:
                w.adapters[adapter_name(t["model"], int(t["version"]))] = t["artifact"]
                w.ranks.append(int(((t.get("signature") or {}).get("lora") or {}).get("rank") or 1))
    return {key: EngineSpec(key, w.artifact, idle_merged(w), w.replicas, lora_flags(w), dict(w.adapters))
            for key, w in wanted.items()}


def idle_merged(w: _Wanted) -> dict[str, Any]:
    """The engine sleeps (serving/llm/kube/idle.py) only when every endpoint sharing it lets it, after the
    longest idle time any of them gives: one endpoint's choice never puts another's engine to sleep."""
    after = None if None in w.idle_after else max(w.idle_after, default=None)
    return {**{k: v for k, v in w.options.items() if k != "scale_to_zero_after_s"},
            **({"scale_to_zero_after_s": after} if after else {})}


def lora_flags(w: _Wanted) -> tuple[int, int] | None:
    """LoRA on when an adapter runs in the engine, or an endpoint sharing it sized it (``max_lora_rank``,
    ``max_loras``: then it starts with LoRA on, and adapters join it later without a restart).
    ``--max-lora-rank``: the largest an endpoint asked for or an adapter has; with none asked, at least
    vLLM's default 16, so adapters of the usual ranks join without a restart. ``--max-loras``: as asked,
    else :data:`DEFAULT_MAX_LORAS`. A change of either restarts the engine (vLLM sizes its buffers once)."""
    if not w.adapters and not w.lora_asked:
        return None
    rank = engine_rank(max([*w.asked_ranks, *w.ranks] if w.asked_ranks else [16, *w.ranks]))
    return rank, max(w.max_loras or [DEFAULT_MAX_LORAS])


def vllm_command(python: Path | str, spec: EngineSpec, model_dir: Path | str, port: int, kv_cache_gb: float | None,
                 default_args: list[str] | tuple[str, ...] = (), tracing: str | None = None,
                 host: str = "127.0.0.1") -> list[str]:
    """vLLM's OpenAI server on host:port for this engine (127.0.0.1 here; a pod's every address on
    Kubernetes); options map onto vLLM's own flags.
    ``default_args`` (``SERVING_VLLM_DEFAULT_ARGS``) come first: vLLM takes the last of a flag given twice,
    so the platform's own flags, the endpoint's options and its ``extra_args`` all win over them."""
    opts = spec.options
    cmd = [str(python), "-m", VLLM_MODULE, *default_args, "--model", str(model_dir), "--served-model-name", spec.key,
           "--host", host, "--port", str(port)]
    for key, flag in OPTION_FLAGS.items():
        if opts.get(key) is not None:
            cmd += [flag, str(opts[key])]
    kv_gb = opts.get("kv_cache_space_gb")
    if kv_gb is None and opts.get("gpu_memory_utilization") is None:
        kv_gb = kv_cache_gb  # the platform's default; a GPU fraction, when given, sizes the cache instead
    if kv_gb:
        cmd += ["--kv-cache-memory-bytes", str(int(float(kv_gb) * GIB))]
    if spec.lora is not None:
        cmd += ["--enable-lora", "--max-lora-rank", str(spec.lora[0]), "--max-loras", str(spec.lora[1])]
    if tracing:  # vLLM's OpenTelemetry spans, continuing the worker's trace from each request's traceparent
        from serving.tracing.spans import traces_url

        cmd += ["--otlp-traces-endpoint", traces_url(tracing)]
    return cmd + list(opts.get("extra_args") or [])


def engine_env(spec: EngineSpec, tracing: str | None = None) -> dict[str, str]:
    """What an engine's environment needs beyond its placement: adapters loaded at runtime need vLLM's
    ``/v1/load_lora_adapter``, which it serves only with this set; with tracing, OTLP over HTTP (vLLM's
    exporter defaults to gRPC) and the service's name in its spans."""
    env = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"} if spec.lora is not None else {}
    if tracing:
        env |= {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_SERVICE_NAME": "vllm"}
    return env


def start_engine(command: list[str], log_path: Path, placement: dict[str, str] | None = None) -> subprocess.Popen:
    """In a process group of its own (its EngineCore child goes with it), SIGTERM should the launcher die;
    ``placement``: its cores or GPUs (serving/llm/launch/placement.py)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the legacy variable would override --kv-cache-memory-bytes
    env.update(placement or {})
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

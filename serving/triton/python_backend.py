"""The embedded Triton's model repository and server: Triton's own Python backend, no PyTriton proxy.

Per ONNX model: ``<repo>/<name>/config.pbtxt`` (backend "python", built from Triton's protobuf
schema and validated like serving/triton/repository.py does) and ``<repo>/<name>/1/`` holding
``model.py`` (a copy of serving/triton/backend_model.py) and ``model.onnx``.

The server is the ``tritonserver`` binary the nvidia-pytriton wheel ships (its only use of that
package), started the way PyTriton starts it: a backends directory with the python backend and
the stub built for this interpreter, the wheel's libraries on the library path, explicit model
control. The model-repository API is guarded by an access token, as PyTriton did.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc

from serving.triton.naming import TRITON_VERSION
from serving.triton.repository import (
    MARKER, TritonTarget, _add_tensors, _place_file, _write_text, validate_config_pbtxt,
)
from serving.triton.shapes import batch_size

BACKEND_MODEL = Path(__file__).with_name("backend_model.py")
ACCESS_HEADER = "triton-access" + "-token"
RESTRICTED = "shared-memory,model-repository,statistics,trace,logging"
SHM_DEFAULT_BYTES = 4 * 1024 * 1024  # the python backend's 64 MB default per instance is far more than needed
SHM_GROWTH_BYTES = 1024 * 1024


MAX_DEFAULT_INSTANCES = 4  # each instance holds its own copy of the model: bounded memory on big boxes


def instance_layout(requested: int, threads: int | None = None, cores: int | None = None,
                    gpu: bool = False) -> tuple[int, int]:
    """(instances, onnxruntime intra-op threads per instance) for a model on ``cores`` cores.

    On CPU: one single-thread instance per core by default (at least ``requested``; past
    MAX_DEFAULT_INSTANCES cores, that many instances sharing the cores, as each holds the model
    in memory; only 2 cores were measured). Measured on
    2 cores (benchmarks/results/full.json, onnxruntime alone, no HTTP): one session with both
    cores ran W2 (MiniLM-L6) at 83.0 texts/s and W1 at 958, two single-thread sessions side by
    side at 92.0 and 1312; Triton hands concurrent requests (and the worker batcher's two calls
    in flight) to separate instances, which is that second layout. ``threads`` (the
    SERVING_TRITON_ORT_THREADS setting) gives each instance that many and cores/threads
    instances instead. On a GPU the endpoint's ``instances`` stand (the GPU, not the cores, runs
    the model; more sessions only take its memory), sharing the cores for their CPU work."""
    cores = cores or os.cpu_count() or 1
    requested = max(1, requested)
    if gpu:
        return requested, threads or max(1, cores // requested)
    if threads:
        return max(requested, cores // threads), threads
    instances = max(requested, min(cores, MAX_DEFAULT_INSTANCES))
    return instances, max(1, cores // instances)


def has_gpu() -> bool:
    from serving.ort import providers

    return "CUDAExecutionProvider" in providers()


def model_config(target: TritonTarget, signature: dict[str, Any], threads: int,
                 instances: int | None = None) -> mc.ModelConfig:
    b = target.batching
    max_batch = batch_size(b, signature)
    cfg = mc.ModelConfig(name=target.name, backend="python", max_batch_size=max_batch)
    if max_batch > 0:
        preferred = sorted({int(s) for s in b.get("preferred_batch_sizes") or [] if 0 < int(s) <= max_batch})
        cfg.dynamic_batching.max_queue_delay_microseconds = int(b.get("max_queue_delay_us") or 0)
        # No preferred sizes given: every size is preferred, so a free instance takes whatever is
        # queued at once instead of idling up to the queue delay for more (continuous batching;
        # requests still pile up into batches while the instances are busy). The worker's batcher
        # already merges what queues behind a call, and Triton cannot merge its calls (their
        # shapes differ), so the delay only added latency: 2 ms on W1's 3 ms requests.
        cfg.dynamic_batching.preferred_batch_size.extend(preferred or range(1, max_batch + 1))
    # KIND_CPU: the stub is a CPU process either way; onnxruntime inside it takes CUDA when present
    count = instances or max(1, int(b.get("instances") or 1))
    cfg.instance_group.add(count=count, kind=mc.ModelInstanceGroup.KIND_CPU)
    _add_tensors(cfg.input, signature.get("inputs", []), max_batch > 0)
    _add_tensors(cfg.output, signature.get("outputs", []), max_batch > 0)
    cfg.parameters["ort_threads"].string_value = str(threads)
    cfg.parameters["onnx_file"].string_value = "model.onnx"
    cfg.parameters["artifact"].string_value = target.artifact
    return cfg


def config_pbtxt(target: TritonTarget, signature: dict[str, Any], threads: int, instances: int | None = None) -> str:
    from google.protobuf import text_format

    text = text_format.MessageToString(model_config(target, signature, threads, instances))
    validate_config_pbtxt(text)
    return text


def write_entry(repo_dir: Path, target: TritonTarget, onnx_path: Path, signature: dict[str, Any],
                threads: int, instances: int | None = None) -> bool:
    """Write (or refresh) one model directory; returns whether anything changed."""
    model_dir = Path(repo_dir) / target.name
    version_dir = model_dir / str(TRITON_VERSION)
    version_dir.mkdir(parents=True, exist_ok=True)
    text = config_pbtxt(target, signature, threads, instances)
    changed = _write_text(model_dir / MARKER, json.dumps({"artifact": target.artifact}))
    if changed or not (version_dir / "model.onnx").exists():
        _place_file(Path(onnx_path), version_dir / "model.onnx")
        changed = True
    changed = _write_text(version_dir / "model.py", BACKEND_MODEL.read_text()) or changed
    return _write_text(model_dir / "config.pbtxt", text) or changed


def pytriton_root() -> Path:
    """The tritonserver distribution inside the nvidia-pytriton wheel (binary, backends, stubs)."""
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.origin:
        raise RuntimeError("the embedded Triton needs nvidia-pytriton (it ships the tritonserver binary)")
    return Path(spec.origin).parent / "tritonserver"


def prepare_backends(workspace: Path) -> Path:
    """``<workspace>/backends/python`` with the backend library and this interpreter's stub."""
    root = pytriton_root()
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.exists():
        raise RuntimeError(f"nvidia-pytriton has no Python-backend stub for Python {version}")
    dest = workspace / "backends" / "python"
    dest.mkdir(parents=True, exist_ok=True)
    for f in (root / "backends" / "python").iterdir():
        if f.is_file():
            shutil.copy(f, dest / f.name)
    shutil.copy(stub, dest / "triton_python_backend_stub")
    return workspace / "backends"


@dataclass
class ServerCommand:
    args: list[str]
    env: dict[str, str]
    token: str
    shm_prefix: str  # the Python backend's /dev/shm segments start with it (removed after the server)


SHM_PREFIX = "serving"  # + the embedded Triton's pid: clean_stale finds a dead one's segments


def remove_shm(prefix: str) -> int:
    """The Python backend's shared-memory segments of a tritonserver that is gone: a server killed
    with SIGKILL never unlinks them, and /dev/shm keeps them until reboot."""
    removed = 0
    for segment in Path("/dev/shm").glob(f"{prefix}*"):
        segment.unlink(missing_ok=True)
        removed += 1
    return removed


def control_call(http_url: str, headers: dict[str, str], timeout: float, method: str, *args: Any) -> Any:
    """One call to the embedded Triton's HTTP API (``headers``: its model-control key), on a client
    of its own: the binder and the budget's loader call it from different threads."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(http_url, network_timeout=timeout, connection_timeout=timeout)
    try:
        return getattr(client, method)(*args, headers=headers)
    finally:
        client.close()


def trace_args(endpoint: str | None) -> list[str]:
    """Triton's OpenTelemetry mode, exporting to the platform's collector (docs/tracing.md). Every request
    that reaches Triton is traced (rate 1): the worker's sampler already chose which traces are kept, and
    Triton continues the worker's trace from the ``traceparent`` in the request's gRPC metadata."""
    if not endpoint:
        return []
    from serving.tracing.spans import traces_url

    return ["--trace-config=mode=opentelemetry", "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
            "--trace-config=count=-1", f"--trace-config=opentelemetry,url={traces_url(endpoint)}",
            "--trace-config=opentelemetry,resource=service.name=triton"]


def server_command(workspace: Path, repo_dir: Path, host: str, http_port: int, grpc_port: int,
                   metrics_port: int, tracing: str | None = None) -> ServerCommand:
    """tritonserver's command line and environment (what PyTriton builds, minus its proxy)."""
    root = pytriton_root()
    backends = prepare_backends(workspace)
    token = secrets.token_urlsafe(24)
    restricted = f"{RESTRICTED}:{ACCESS_HEADER}={token}"
    prefix = f"{SHM_PREFIX}{os.getpid()}-{secrets.token_hex(3)}-"
    args = [
        str(root / "bin" / "tritonserver"),
        f"--model-repository={repo_dir}", "--model-control-mode=explicit", "--strict-readiness=true",
        f"--backend-directory={backends}", f"--cache-directory={root / 'caches'}",
        f"--http-address={host}", f"--http-port={http_port}",
        f"--grpc-address={host}", f"--grpc-port={grpc_port}",
        f"--metrics-address={host}", f"--metrics-port={metrics_port}", "--allow-gpu-metrics=false",
        f"--http-restricted-api={restricted}", f"--grpc-restricted-protocol={restricted}",
        f"--backend-config=python,shm-region-prefix-name={prefix}",
        f"--backend-config=python,shm-default-byte-size={SHM_DEFAULT_BYTES}",
        f"--backend-config=python,shm-growth-byte-size={SHM_GROWTH_BYTES}",
        "--exit-timeout-secs=5", "--log-verbose=0", "--log-info=false", *trace_args(tracing),
    ]
    env = dict(os.environ)
    libs = [sysconfig.get_config_var("LIBDIR") or "", str(root.parent.parent / "nvidia_pytriton.libs")]
    env["LD_LIBRARY_PATH"] = ":".join([p for p in libs if p] + [env.get("LD_LIBRARY_PATH", "")]).rstrip(":")
    # The stub embeds libpython: give it this venv's packages and the serving package (for serving.ort)
    paths = [str(Path(__file__).resolve().parents[2]), sysconfig.get_paths()["purelib"],
             sysconfig.get_paths()["platlib"]]
    env["PYTHONPATH"] = ":".join(dict.fromkeys(p for p in [*paths, env.get("PYTHONPATH", "")] if p))
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return ServerCommand(args, env, token, prefix)


def start_server(cmd: ServerCommand) -> subprocess.Popen:
    return subprocess.Popen(cmd.args, env=cmd.env, stdin=subprocess.DEVNULL)

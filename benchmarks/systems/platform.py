"""This platform, driven exactly as a user drives it: ``serving up``, ``serving model upload/add``.

One stack per (worker processes, statistics on/off); in each, one endpoint per
engine configuration, so the variants of a stack share its start-up:

- ``triton-nobatch``: engine triton, Triton's dynamic batching off (``--max-batch-size 0``)
- ``triton-batch``: engine triton, dynamic batching on (32, 2 ms queue delay)
- ``triton-batch-1shape``: the same with every text padded to the truncation length, so that
  Triton's batcher, which only batches requests of one shape, can batch all of them
- ``ort``: the onnxruntime engine inside the worker (no Triton hop, no cross-request batching)
- ``ort-fusion`` / ``ort-int8``: the same, with the model uploaded with ``--optimize fusion`` or
  ``--optimize int8`` (the model-side lever); their label agreement with ``ort`` on the corpus is
  measured over HTTP and recorded with the result

Each configuration registers its own copy of the model (a Triton model's batching
is fixed at load), and the statistics-off stack (``SERVING_STATISTICS_ENABLED=false``)
measures what per-request statistics cost against the same configuration with them on.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Iterator

import httpx

from benchmarks.corpus import read_corpus
from benchmarks.procs import child_env, process, wait_http
from benchmarks.systems.base import RunContext, System, Target
from benchmarks.workloads import MAX_LENGTH

NAME = "platform"
MAX_BATCH = 32
QUEUE_DELAY_US = 2000

AGREEMENT_TEXTS = 64  # corpus texts sent to an optimized endpoint and to ``ort`` to compare labels


@dataclass(frozen=True)
class Endpoint:
    label: str
    add: list[str]                                    # extra `serving model add` options
    upload: list[str] = field(default_factory=list)  # extra `serving model upload` options


ORT = ["--engine", "onnxruntime"]
ENDPOINTS: dict[str, Endpoint] = {
    "triton-nobatch": Endpoint("engine triton, dynamic batching off", ["--engine", "triton", "--max-batch-size", "0"]),
    "triton-batch": Endpoint("engine triton, dynamic batching on", [
        "--engine", "triton", "--max-batch-size", str(MAX_BATCH), "--max-queue-delay-us", str(QUEUE_DELAY_US)]),
    # Triton's batcher closes a batch at the first queued request of another shape; one bucket (every
    # text padded to the truncation length) lets it batch everything, at the price of computing the
    # padding. Kept beside triton-batch, whose worker-side batching pads to the longest instead.
    "triton-batch-1shape": Endpoint("engine triton, dynamic batching on, one shape (--pad-to-multiple-of 128)", [
        "--engine", "triton", "--max-batch-size", str(MAX_BATCH), "--max-queue-delay-us", str(QUEUE_DELAY_US),
        "--pad-to-multiple-of", str(MAX_LENGTH)]),
    "ort": Endpoint("engine onnxruntime in the worker", ORT),
    "ort-fusion": Endpoint("engine onnxruntime, model fused at upload (--optimize fusion)", ORT,
                           ["--optimize", "fusion"]),
    "ort-int8": Endpoint("engine onnxruntime, model fused + int8 at upload (--optimize int8)", ORT,
                         ["--optimize", "int8"]),
}


@dataclass(frozen=True)
class Stack:
    """One ``serving up``: its worker count, whether statistics are recorded, its endpoints."""

    suffix: str
    workers: int
    statistics: bool
    endpoints: tuple[str, ...]
    client_keys: bool = False  # workers require client keys (SERVING_CLIENT_KEYS_REQUIRED=true)

    def variant(self, endpoint: str) -> str:
        return f"{NAME}-{endpoint}-{self.suffix}"


STACKS = (
    Stack("1w", 1, True, ("triton-nobatch", "triton-batch", "triton-batch-1shape", "ort", "ort-fusion", "ort-int8")),
    Stack("2w", 2, True, ("triton-nobatch", "triton-batch", "ort")),
    Stack("1w-nostats", 1, False, ("triton-batch", "ort")),
)
VARIANTS = tuple(stack.variant(ep) for stack in STACKS for ep in stack.endpoints)


def stack_env(ctx: RunContext, stack: Stack) -> dict[str, str | None]:
    """Fresh state and free ports (the demo's recipe), statistics on or off."""
    from serving.demo import stack_env as demo_env

    home = ctx.log_dir / f"{NAME}-{stack.suffix}-home"
    shutil.rmtree(home, ignore_errors=True)
    env = demo_env(home)
    env["SERVING_STATISTICS_ENABLED"] = "true" if stack.statistics else "false"
    env["SERVING_CLIENT_KEYS_REQUIRED"] = "true" if stack.client_keys else "false"
    # Control-plane auth: the stack's control plane writes its bootstrap tokens under its fresh
    # SERVING_HOME, where its CLI calls and processes find them (serving/credentials.py); a token
    # of the user's own platform in our environment must not reach it (None: unset in the child).
    tokens: dict = dict.fromkeys(("SERVING_TOKEN", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN"))
    return {**{k: v for k, v in env.items() if k.startswith("SERVING_")}, **tokens}


def cli(env: dict[str, str | None], *args: str) -> str:
    """``serving ...`` as a user types it; its stdout, or its output in the error on failure."""
    out = subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=child_env(env),
                         capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"serving {' '.join(args)} failed: {out.stdout[-1000:]}{out.stderr[-2000:]}")
    return out.stdout


def deploy(ctx: RunContext, env: dict[str, str | None], endpoint: str) -> None:
    wl = ctx.workload
    model = f"bench-{endpoint}"
    cli(env, "model", "upload", "--name", model, "--path", str(wl.onnx_path), *ENDPOINTS[endpoint].upload)
    cli(env, "model", "add", "--endpoint", endpoint, "--model", f"{model}:1", "--tokenizer", str(wl.tokenizer_dir),
        "--labels", ",".join(wl.labels), *ENDPOINTS[endpoint].add)


def label_agreement(worker: str, endpoint: str, reference: str, texts: list[str]) -> float:
    """Share of texts on which ``endpoint`` predicts the label ``reference`` predicts."""
    with httpx.Client(timeout=60) as client:
        labels = [[client.post(f"{worker}/serve/{ep}", json={"text": t}).json()["label"] for t in texts]
                  for ep in (endpoint, reference)]
    return sum(a == b for a, b in zip(*labels)) / len(texts)


def wait_serving(url: str, body: dict, timeout: float, procs: list[subprocess.Popen], streak: int = 8,
                 headers: dict[str, str] | None = None) -> None:
    """Until ``streak`` requests in a row succeed: with N workers each process must have the config."""
    deadline = time.monotonic() + timeout
    ok, last = 0, None
    while ok < streak:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not serving after {timeout:.0f}s (last: {last})")
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("serving up exited; see its log")
        try:
            resp = httpx.post(url, json=body, timeout=30, headers=headers)
            ok, last = (ok + 1, None) if resp.status_code == 200 else (0, f"{resp.status_code} {resp.text[:200]}")
        except httpx.HTTPError as exc:
            ok, last = 0, exc
        if ok == 0:
            time.sleep(0.3)


def targets(ctx: RunContext) -> Iterator[Target]:
    for stack in STACKS:
        wanted = [ep for ep in stack.endpoints if ctx.wants(stack.variant(ep))]
        if not wanted:
            continue
        env = stack_env(ctx, stack)
        worker = f"http://127.0.0.1:{env['SERVING_WORKER_PORT']}"
        args = ["-m", "serving.cli.main", "up", "--workers", str(stack.workers)]
        with process(args, ctx.log_dir / f"{NAME}-{stack.suffix}.log", env=env) as proc:
            wait_http(f"{worker}/v2/health/live", timeout=240, procs=[proc])
            for endpoint in wanted:
                deploy(ctx, env, endpoint)
            for endpoint in wanted:
                url = f"{worker}/serve/{endpoint}"
                wait_serving(url, {"text": "warm up the endpoint"}, timeout=180, procs=[proc])
                stats = "on" if stack.statistics else "off"
                spec = ENDPOINTS[endpoint]
                label = (f"platform, {stack.workers} worker{'s' if stack.workers > 1 else ''}, "
                         f"{spec.label}, statistics {stats}")
                details = {"workers": stack.workers, "statistics": stack.statistics, "endpoint": endpoint,
                           "options": spec.add, "upload_options": spec.upload}
                if spec.upload and "ort" in wanted:
                    texts = read_corpus(ctx.corpus_path)[:AGREEMENT_TEXTS]
                    details["label_agreement"] = label_agreement(worker, endpoint, "ort", texts)
                yield Target(stack.variant(endpoint), label, url, "text_json", procs=[proc], details=details)


SYSTEM = System(NAME, "this platform: serving up --workers N, one endpoint per engine configuration",
                variants=VARIANTS, targets=targets)

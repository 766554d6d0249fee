"""``python -m benchmarks.systems.torchserve_ceiling --mar M --inputs F1,F2 [--runtime torch|onnx] ...``.

The ceiling of the TorchServe benchmark (benchmarks/torchserve.py): an archive's handler in this
process, no HTTP, no queue, no pipe. The handler is loaded as the platform's handler processes load
it (serving/torchserve/handler_process.py's ``Handler``: TorchServe's own loader and context) and
given batches of the same request bodies the HTTP systems get, so its decoding, preprocessing,
model and postprocessing (the JSON of each answer included) are all counted. Runtime ``onnx`` is the
platform's own swap (serving/torchserve/onnx_swap.py: the model exported on the first batch and run
by onnxruntime inside the unchanged handler), so both ceilings bound exactly what the platform runs.

Each configuration is ``streams`` processes side by side (spawned, each its own handler) with
``threads`` intra-op threads each, taking batches of ``batch`` bodies in turn for ``--seconds``:
on a 2-core box one stream on both cores and two streams on one core each, at batch 1 and 8. Prints
one JSON line: requests/s, CPU ms a request and batch latencies per configuration, the best of them,
and (``--answers``) each input's answer, for the benchmark's answer check.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "torchserve"


@dataclass(frozen=True)
class Config:
    runtime: str  # torch | onnx
    streams: int  # processes side by side
    threads: int  # intra-op threads of each
    batch: int    # requests a handler call

    @property
    def name(self) -> str:
        return f"{self.runtime}, batch {self.batch}, {self.streams} stream(s) x {self.threads} thread(s)"


def model_dir(mar: Path) -> Path:
    from serving.torchserve.archive import unpack

    return unpack(mar, CACHE / "unpacked")


def load_handler(mar: Path, batch: int, threads: int, runtime: str = "torch") -> Any:
    """The archive's handler, loaded by the platform's handler-process code (TorchServe's loader), with
    the platform's ONNX swap for ``runtime`` onnx (serving/torchserve/onnx_swap.py)."""
    import torch

    from serving.torchserve.archive import read_archive
    from serving.torchserve.handler_process import Handler

    torch.set_num_threads(threads)
    info = read_archive(mar)
    return Handler({"model_dir": str(model_dir(mar)), "model_name": info.model_name, "handler": info.handler,
                    "batch_size": batch, "gpu_id": None, "threads": threads, "runtime": runtime})


def requests(bodies: list[bytes]) -> list[Any]:
    """The bodies as TorchServe's frontend hands a raw PUT to the backend (``body``, no content type)."""
    from serving.torchserve.codec import HandlerRequest, Parameter

    return [HandlerRequest(f"ceiling-{i}", [Parameter("body", body, "")]) for i, body in enumerate(bodies)]


def prepared(mar: Path, config: Config, bodies: list[bytes]) -> Any:
    """The handler after its first batch: with runtime onnx the swap exports the model on that batch and
    runs onnxruntime from then on; RuntimeError when it stays with torch (the reason says why)."""
    handler = load_handler(mar, config.batch, config.threads, config.runtime)
    ring = requests(bodies)
    handler.predict([ring[k % len(ring)] for k in range(config.batch)])
    swap = getattr(handler, "swap", None)
    if config.runtime == "onnx" and (swap is None or swap.runtime != "onnx"):
        raise RuntimeError(f"the ONNX swap did not take: {getattr(swap, 'reason', 'no swap installed')}")
    return handler


def _stream(mar: str, config: dict, bodies: list[bytes], seconds: float, offset: int, barrier: Any,
            results: Any) -> None:
    """One stream: load, warm up, then batches for ``seconds`` after every stream is ready."""
    cfg = Config(**config)
    handler = prepared(Path(mar), cfg, bodies)
    ring = requests(bodies)
    take = lambda i: [ring[(i + k) % len(ring)] for k in range(cfg.batch)]  # noqa: E731
    for i in range(3):
        handler.predict(take(i))
    barrier.wait()
    start, cpu0 = time.perf_counter(), _cpu()
    done, latencies, i = 0, [], offset
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        answers = handler.predict(take(i))
        latencies.append(time.perf_counter() - t)
        if any(a.status != 200 for a in answers):
            raise RuntimeError(f"the handler failed: {answers[0].message}")
        done += cfg.batch
        i += cfg.batch
    results.put({"requests": done, "wall_s": time.perf_counter() - start, "cpu_s": _cpu() - cpu0,
                 "latencies": latencies})


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(mar: Path, config: Config, bodies: list[bytes], seconds: float) -> dict:
    """One configuration: its streams spawned (a fresh interpreter each, as a handler process is)."""
    import numpy as np

    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(config.streams), ctx.Queue()
    procs = [ctx.Process(target=_stream, args=(str(mar), asdict(config), bodies, seconds, k * 7, barrier, results))
             for k in range(config.streams)]
    for proc in procs:
        proc.start()
    outs = [results.get(timeout=seconds + 600) for _ in procs]
    for proc in procs:
        proc.join(60)
        if proc.exitcode != 0:
            raise RuntimeError(f"a ceiling stream exited with {proc.exitcode}")
    total = sum(o["requests"] for o in outs)
    wall = max(o["wall_s"] for o in outs)
    lat_ms = np.asarray([x for o in outs for x in o["latencies"]]) * 1000
    return {**asdict(config), "name": config.name, "rps": total / wall, "requests": total,
            "cpu_ms_per_request": sum(o["cpu_s"] for o in outs) * 1000 / max(1, total),
            "batch_p50_ms": float(np.percentile(lat_ms, 50)), "batch_p99_ms": float(np.percentile(lat_ms, 99))}


def answers(mar: Path, runtime: str, bodies: dict[str, bytes]) -> dict[str, str]:
    """Each input's answer, one request a call, as text (what the HTTP systems' bodies are compared with)."""
    handler = prepared(mar, Config(runtime, 1, 1, 1), list(bodies.values()))
    out = {}
    for name, request in zip(bodies, requests(list(bodies.values()))):
        (answer,) = handler.predict([request])
        out[name] = answer.body.decode("utf-8", errors="replace")
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mar", type=Path, required=True)
    p.add_argument("--inputs", required=True, help="comma-separated files: the request bodies, in order")
    p.add_argument("--runtimes", default="torch,onnx")
    p.add_argument("--layouts", default="1x2,2x1", help="STREAMSxTHREADS, comma-separated")
    p.add_argument("--batch-sizes", default="1,8")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--answers", action="store_true", help="also print each input's answer per runtime")
    args = p.parse_args(argv)
    args.mar = args.mar.resolve()  # loading a handler changes the working directory (TorchServe's rule)
    files = [Path(f) for f in args.inputs.split(",")]
    bodies = {f.name: f.read_bytes() for f in files}
    runtimes = args.runtimes.split(",")
    configs = [Config(runtime, int(s), int(t), int(b)) for runtime in runtimes
               for s, t in (layout.split("x") for layout in args.layouts.split(","))
               for b in args.batch_sizes.split(",")]
    levels = []
    for config in configs:
        levels.append(measure(args.mar, config, list(bodies.values()), args.seconds))
        print(f"{config.name}: {levels[-1]['rps']:.1f} requests/s", file=sys.stderr, flush=True)
    result: dict[str, Any] = {"levels": levels}
    for runtime in runtimes:
        best = max((lv for lv in levels if lv["runtime"] == runtime), key=lambda lv: lv["rps"])
        result[f"best_{runtime}"] = best
    if args.answers:
        result["answers"] = {runtime: answers(args.mar, runtime, bodies) for runtime in runtimes}
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""Closed-loop load of v2 tensor requests with NVIDIA's own clients, as its own process:
``python -m benchmarks.tensor_load --protocol grpc|http --target HOST:PORT --endpoint E --tokens FILE``.

The same token tensors (one text a request, tokenized before the clock starts) go over gRPC
(``tritonclient.grpc.aio``) or over HTTP v2 with the binary tensor extension
(``tritonclient.http.aio``), from ``concurrency`` clients each holding its own connection. What
differs is the protocol and its client library: what a Triton or KServe user would run. Prints one
JSON object: req/s, latency percentiles, errors, and this process's CPU seconds (it shares the cores).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time

import numpy as np

LOCAL_POOL = [("grpc.use_local_subchannel_pool", 1)]  # one connection per client, not one shared


def load_tokens(path: str) -> list[dict[str, np.ndarray]]:
    rows = json.loads(open(path).read())
    return [{k: np.array([v], dtype=np.int64) for k, v in row.items()} for row in rows]


def make_client(protocol: str, target: str):
    if protocol == "grpc":
        import tritonclient.grpc.aio as module

        return module, module.InferenceServerClient(target, channel_args=LOCAL_POOL)
    import tritonclient.http.aio as module

    return module, module.InferenceServerClient(target, conn_limit=1)


def inputs_for(module, feeds: dict[str, np.ndarray]) -> list:
    out = []
    for name, array in feeds.items():
        tensor = module.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


async def run(protocol: str, target: str, endpoint: str, tokens: list[dict[str, np.ndarray]], concurrency: int,
              warmup_s: float, duration_s: float) -> dict:
    clients = [make_client(protocol, target) for _ in range(concurrency)]
    module = clients[0][0]
    requests = [inputs_for(module, feeds) for feeds in tokens]
    latencies: list[float] = []
    errors: list[str] = []
    t_start = time.perf_counter()
    measure_from, stop_at = t_start + warmup_s, t_start + warmup_s + duration_s

    async def one(i: int, client) -> None:
        k = i
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            try:
                await client.infer(endpoint, requests[k % len(requests)])
                if t0 >= measure_from:
                    latencies.append(time.perf_counter() - t0)
            except Exception as exc:  # counted, never fatal: the run says how many
                if t0 >= measure_from:
                    errors.append(str(exc)[:200])
            k += concurrency

    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    await asyncio.gather(*(one(i, c) for i, (_, c) in enumerate(clients)))
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    for _, c in clients:
        await c.close()
    ms = np.array(latencies) * 1000 if latencies else np.array([float("nan")])
    return {"protocol": protocol, "rps": round(len(latencies) / duration_s, 1),
            "p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2),
            "requests": len(latencies), "errors": len(errors), "first_error": errors[0] if errors else None,
            "client_cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 2)}


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tensor_load")
    p.add_argument("--protocol", choices=("grpc", "http"), required=True)
    p.add_argument("--target", required=True, help="host:port")
    p.add_argument("--endpoint", required=True)
    p.add_argument("--tokens", required=True, help="JSON list of {input name: [token ids]}")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--warmup-s", type=float, default=2.0)
    p.add_argument("--duration-s", type=float, default=10.0)
    a = p.parse_args()
    result = asyncio.run(run(a.protocol, a.target, a.endpoint, load_tokens(a.tokens), a.concurrency,
                             a.warmup_s, a.duration_s))
    print(json.dumps(result))


if __name__ == "__main__":
    main()

"""``python -m benchmarks.prediction_log_cost [--rounds 2] [--duration-s 8] [--warmup-s 1]``.

What the prediction log (docs/prediction-log.md) costs a W2 endpoint (the onnxruntime engine in the
worker, MiniLM-L6) under 32 concurrent clients, four ways:

1. Throughput of real worker processes, logging off, at 10% and at 100%, to files and to Kafka (a real
   Kafka-protocol broker, Tansu). This shared 2-core box moves by about 10% run to run, so the variants
   are interleaved: each round runs ``off, A, A, off, B, B, off, ...`` (the next round in the reverse
   order) and a variant's ratio is the mean of its two runs over the mean of the ``off`` runs on either
   side, so a drift of the machine over those four runs cancels. Each run also reads the worker's own CPU
   time (``/proc``) and its count of answered requests (``GET /v2/models/E/versions/1/stats``): CPU per request.
2. CPU time per logged request, with CPU clocks as ``benchmarks.statistics_cost`` does: the request
   path's share (``PredictionCapture.start`` + ``finish``: ``build`` and ``PredictionLog.offer``) on a
   W2-shaped body and answer, and the writer's share per record for each sink (its thread, and Kafka's
   producer thread), in batches of what one flush interval gathers at the measured W2 rate. The total,
   times the logged records per second over the cores, is the share of the machine logging takes: on a
   CPU-bound server, the throughput it costs.
3. Sink down: a worker logging 100% to Kafka at a closed port, with a queue bound of 200, is run in the
   rounds like any variant (it must not be slower than ``off``), then its ``GET /status`` must say
   ``dropped`` = requests its endpoint answered (Triton's statistics of the worker) - 200, ``queued`` =
   200, ``written`` = 0, and 50 more requests, one at a time beside one to ``off`` each, must add exactly
   50 to ``dropped``. The live sinks are read back too: every request of a 100% endpoint is in the files
   or the topic once, and the worker's ``written`` is what the sink holds.

4. Tracing on at 100% (docs/tracing.md), logging off: the ``tracing-100`` variant, its spans exported over
   OTLP/HTTP to a receiver in this process (tests/support/otlp.py).

Every variant is a name, the endpoint's sample share and the worker's extra environment (``VARIANTS``);
variants with the same environment share one worker process, every worker serves the same three
endpoints (one per sample share) of one control plane. Statistics are off in every worker
(``SERVING_STATISTICS_ENABLED=false``), so that Kafka-bound statistics do not ride along with the Kafka
variants. Prints a table; writes ``results/prediction-log-cost.json`` and ``.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform as py_platform
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from rich.table import Table

from benchmarks import corpus as corpus_mod
from benchmarks.prediction_log_cpu import cpu_clocks
from benchmarks.prediction_log_plan import (BASELINE, CONCURRENCY, CORPUS_SIZE, LOG_DIR, RESULTS_DIR, TARGET,
                                            TRACING_TARGET, VARIANTS,
                                            baseline_noise, check_variants, console, ratios, spread)
from benchmarks.prediction_log_workers import throughput
from benchmarks.procs import REPO
from benchmarks.workloads import prepare
from tests.support.otlp import Receiver

def summarize(runs: list[dict[str, Any]], variants: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: means of its runs, and its ratios to off (req/s, p99, the worker's CPU per request) with
    their spread over the rounds; ``added_cpu_us``: the CPU ratio as µs a request, on off's CPU per request."""
    rps, p99, cpu = ratios(runs, "rps"), ratios(runs, "p99_ms"), ratios(runs, "worker_cpu_us")
    out: dict[str, Any] = {}
    base_cpu = statistics.mean(r["worker_cpu_us"] for r in runs if r["variant"] == BASELINE)
    for v in variants:
        mine = [r for r in runs if r["variant"] == v["name"]]
        if not mine:
            continue
        row: dict[str, Any] = {"sample": v["sample"], "runs": len(mine),
                               "rps_mean": statistics.mean(r["rps"] for r in mine),
                               "p50_ms_mean": statistics.mean(r["p50_ms"] for r in mine),
                               "p99_ms_mean": statistics.mean(r["p99_ms"] for r in mine),
                               "worker_cpu_us_mean": statistics.mean(r["worker_cpu_us"] for r in mine),
                               "errors": sum(r["errors"] for r in mine)}
        if v["name"] != BASELINE and v["name"] in rps:
            row["rps_ratio"] = spread(rps[v["name"]])
            row["p99_ratio"] = spread(p99[v["name"]])
            row["cpu_ratio"] = spread(cpu[v["name"]])
            row["added_cpu_us"] = {k: (row["cpu_ratio"][k] - 1) * base_cpu for k in ("mean", "min", "max")}
        out[v["name"]] = row
    return out


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), py_platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip()
    return {"cpu": cpu, "cores": os.cpu_count(), "python": py_platform.python_version(), "commit": commit,
            "load_avg_at_start": os.getloadavg()}


def _fmt(s: dict[str, float] | None, digits: int = 3) -> str:
    return "" if not s else f"{s['mean']:.{digits}f} [{s['min']:.{digits}f} to {s['max']:.{digits}f}]"


def print_tables(result: dict[str, Any]) -> None:
    t = Table(title=f"prediction log on W2, {CONCURRENCY} clients, real workers: ratio to off in the same round, "
                    f"mean [min to max] over {result['rounds']} rounds")
    for col in ("variant", "req/s", "req/s ratio", "p99 ms", "p99 ratio", "worker CPU ms/req", "CPU ratio",
                "added CPU µs/req", "errors"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for name, row in result["summary"].items():
        t.add_row(name, f"{row['rps_mean']:.1f}", _fmt(row.get("rps_ratio")), f"{row['p99_ms_mean']:.0f}",
                  _fmt(row.get("p99_ratio")), f"{row['worker_cpu_us_mean'] / 1000:.2f}", _fmt(row.get("cpu_ratio")),
                  _fmt(row.get("added_cpu_us"), 0), str(row["errors"]))
    console.print(t)
    for label, noise in (("req/s", result["noise"]), ("worker CPU per request", result["cpu_noise"])):
        if noise.get("pairs") and len(noise["pairs"]) > 1:
            console.print(f"off against off ({label}), consecutive off runs: "
                          f"{', '.join(f'{p:.3f}' for p in noise['pairs'])}; one run's noise {noise['run_cv']:.1%}: "
                          f"one round's ratio resolves about ±{noise['resolves_one_block']:.1%}, the mean of "
                          f"{noise['rounds']} about ±{noise['resolves_mean']:.1%} (95%)")
    clocks = result.get("cpu_clocks")
    if clocks:
        c = Table(title=f"CPU clocks per record (W2 at {clocks['rps']:.1f} req/s, {clocks['cores']} cores; the worker "
                        f"spends {(clocks['worker_cpu_us'] or 0) / 1000:.2f} ms of CPU a request with logging off)")
        for col in ("variant", "batch", "request path µs/record", "writer µs/record", "broker µs/record",
                    "added µs/request", "share of machine", "implied ratio", "ratio vs worker CPU"):
            c.add_column(col, justify="left" if col == "variant" else "right")
        for r in clocks["rows"]:
            c.add_row(r["variant"], str(r["batch"]), f"{r['path_per_logged_us']:.1f}", f"{r['writer_us']:.1f}",
                      "" if r["broker_us"] is None else f"{r['broker_us']:.1f}", f"{r['added_per_request_us']:.1f}",
                      f"{r['machine_share']:.3%}", f"{r['implied_ratio']:.4f}",
                      "" if r["ratio_vs_worker_cpu"] is None else f"{r['ratio_vs_worker_cpu']:.4f}")
        console.print(c)
        p = clocks["request_path"]
        console.print(f"request path per request: off {p[0]['per_request_us']:.2f} µs, 10% {p[10]['per_request_us']:.2f} µs, "
                      f"100% {p[100]['per_request_us']:.2f} µs")
    for names, d in result.get("delivered", {}).items():
        if d is None:
            continue
        per = "; ".join(f"{e}: {x['distinct']} of {x['answered']} answered ({x['kept_share']:.1%})"
                        for e, x in d["endpoints"].items() if x["answered"])
        console.print(f"{names} ({d['sink']}): the sink holds {d['records']} records, the worker says written "
                      f"{d['status']['written']}, dropped {d['status']['dropped']}; {per}: exact {d['exact']}")
    for name, d in result.get("sink_down", {}).items():
        a, b = d["after_rounds"], d["after_extra"]
        console.print(f"{name}: after the rounds the endpoint answered {a['offered']}: dropped {a['dropped']} (expected "
                      f"{a['expected_dropped']}), queued {a['queued']}, written {a['written']}: exact {a['exact']}; "
                      f"{d['extra_requests']} more requests ({d['extra_ok']} answered 200) added {d['extra_added_dropped']} "
                      f"dropped: exact {b['exact']}; one by one, median {d['one_by_one_median_ms']['down']:.1f} ms "
                      f"against off's {d['one_by_one_median_ms']['off']:.1f} ms; sink_error {a['sink_error']!r}")


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [(n, r) for n, r in result["summary"].items() if "rps_ratio" in r]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for k, (key, label) in enumerate((("rps_ratio", "req/s"), ("cpu_ratio", "worker CPU per request"))):
        xs = [i + (k - 0.5) * 0.25 for i in range(len(rows))]
        means = [r[key]["mean"] for _, r in rows]
        lo = [r[key]["mean"] - r[key]["min"] for _, r in rows]
        hi = [r[key]["max"] - r[key]["mean"] for _, r in rows]
        ax.errorbar(xs, means, yerr=[lo, hi], fmt="o", capsize=5, label=f"{label} / off: mean, min to max over rounds")
    ax.axhline(1.0, color="black", linewidth=0.8)
    band = (result.get("noise") or {}).get("resolves_mean")
    if band:  # what off against off says a mean ratio can tell from 1
        ax.axhspan(1 - band, 1 + band, color="grey", alpha=0.12,
                   label=f"req/s noise of a mean ratio, from off against off (95%): ±{band:.1%}")
    ax.axhline(TARGET, color="grey", linestyle="--", label=f"target: kafka-100 req/s at least {TARGET} of off")
    ax.axhline(TRACING_TARGET, color="grey", linestyle=":", label=f"target: tracing-100 at least {TRACING_TARGET} of off")
    ax.set_xticks(range(len(rows)), [n for n, _ in rows])
    values = [r[key][m] for _, r in rows for key in ("rps_ratio", "cpu_ratio") for m in ("min", "max")]
    ax.set_ylim(min(0.95, min(values) - 0.01, 1 - (band or 0) - 0.01), max(1.05, max(values) + 0.01, 1 + (band or 0) + 0.01))
    ax.set_title(f"prediction log on W2, {CONCURRENCY} clients: ratio to logging off in the same round")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


@contextmanager
def _broker(tmp: Path) -> Iterator[str]:
    from tests.serving.statistics.kafka_broker import kafka_broker

    with kafka_broker(tmp) as bootstrap:
        yield bootstrap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.prediction_log_cost", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup-s", type=float, default=1.0)
    p.add_argument("--duration-s", type=float, default=8.0)
    p.add_argument("--variants", default=None, help="comma-separated names (off is always in); default: all")
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    check_variants(VARIANTS)
    wanted = set(args.variants.split(",")) | {BASELINE} if args.variants else None
    variants = [v for v in VARIANTS if wanted is None or v["name"] in wanted]
    cores = os.cpu_count() or 1
    t0 = time.monotonic()
    info = machine()
    wl = prepare("W2")
    corpus = LOG_DIR / "corpus-W2.json"
    texts = corpus_mod.write_corpus(wl.tokenizer_dir, CORPUS_SIZE, corpus)
    with tempfile.TemporaryDirectory(prefix="prediction-log-cost-") as tmp, _broker(Path(tmp)) as kafka, \
            Receiver() as otlp:  # the tracing variant's collector: OTLP/HTTP, decoded (tests/support/otlp.py)
        measured = throughput(variants, args.rounds, args.warmup_s, args.duration_s, kafka, otlp.url, corpus,
                              LOG_DIR / "home")
        measured["spans_received"] = len(otlp.spans)
        summary = summarize(measured["runs"], variants)
        rps = summary[BASELINE]["rps_mean"]
        clocks = cpu_clocks(texts, rps, cores, kafka, Path(tmp), summary[BASELINE]["worker_cpu_us_mean"])
    command = "python -m benchmarks.prediction_log_cost " + " ".join(sys.argv[1:] if argv is None else argv)
    result = {"command": command.strip(), "machine": info, "concurrency": CONCURRENCY, "rounds": args.rounds,
              "warmup_s": args.warmup_s, "duration_s": args.duration_s, "target": TARGET, "tracing_target": TRACING_TARGET,
              "variants": variants, "summary": summary, "noise": baseline_noise(measured["runs"], args.rounds),
              "cpu_noise": baseline_noise(measured["runs"], args.rounds, "worker_cpu_us"), **measured, "cpu_clocks": clocks,
              "wall_s": round(time.monotonic() - t0, 1)}
    print_tables(result)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "prediction-log-cost.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out / "prediction-log-cost.png")
    console.print(f"wrote {args.out / 'prediction-log-cost.json'} and .png in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()

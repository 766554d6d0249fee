"""The plan of ``benchmarks.prediction_log_cost``: its variants (a name, the endpoint's sample share and
the worker's extra environment), the interleaved order of the runs, and the arithmetic of their ratios,
noise and drops. No process is started here."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.procs import free_port

RESULTS_DIR = Path(__file__).resolve().parent / "results"
LOG_DIR = RESULTS_DIR / "logs" / "prediction-log-cost"
CONCURRENCY = 32
PAYLOAD = "text_json"
MAX_QUEUE_DOWN = 200      # the sink-down worker's SERVING_PREDICTION_LOG_MAX_QUEUE
EXTRA_DOWN_REQUESTS = 50  # sent one by one after the rounds: each must add one to ``dropped``
TARGET = 0.97             # the issue's: kafka-100 at least this share of off's throughput
BASELINE = "off"
CORPUS_SIZE = 512
console = Console(width=max(190, Console().width))

# --- the variants --------------------------------------------------------------------------------
# name, the endpoint's sample share in percent (0: it does not log), the worker's extra environment.
# "{kafka}" is the live broker, "{closed}" a port nothing listens on, "{otlp}" an OTLP/HTTP trace receiver
# (``addresses()``; a variant whose env names an address it lacks fails before anything starts).
FILES = {"SERVING_PREDICTION_LOG_SINK": "files"}
KAFKA = {"SERVING_PREDICTION_LOG_SINK": "kafka", "SERVING_KAFKA_BOOTSTRAP_SERVERS": "{kafka}"}
KAFKA_DOWN = {"SERVING_PREDICTION_LOG_SINK": "kafka", "SERVING_KAFKA_BOOTSTRAP_SERVERS": "{closed}",
              "SERVING_PREDICTION_LOG_MAX_QUEUE": str(MAX_QUEUE_DOWN)}
OFF = {"SERVING_PREDICTION_LOG_SINK": "off"}
VARIANTS: tuple[dict[str, Any], ...] = (
    {"name": BASELINE, "sample": 0, "env": OFF},
    # A/A control: off's settings in a second worker process (the variable only tells the two apart): what a
    # ratio shows between two processes when nothing differs
    {"name": "off-b", "sample": 0, "env": {**OFF, "SERVING_BENCH_WORKER": "b"}},
    {"name": "files-10", "sample": 10, "env": FILES},
    {"name": "files-100", "sample": 100, "env": FILES},
    {"name": "kafka-10", "sample": 10, "env": KAFKA},
    {"name": "kafka-100", "sample": 100, "env": KAFKA},
    {"name": "kafka-down-100", "sample": 100, "env": KAFKA_DOWN, "sink_down": True},
    # tracing (docs/tracing.md) at 100%, logging off: every request's spans exported over OTLP/HTTP
    {"name": "tracing-100", "sample": 0, "env": {**OFF, "SERVING_TRACING_OTLP_ENDPOINT": "{otlp}",
                                                 "SERVING_TRACING_SAMPLE": "1.0"}},
)
TRACING_TARGET = 0.95  # the issue's: tracing at 100% at least this share of off's throughput


def check_variants(variants: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> None:
    names = [v["name"] for v in variants]
    if len(set(names)) != len(names):
        raise ValueError(f"variant names repeat: {names}")
    if BASELINE not in names:
        raise ValueError(f"no {BASELINE!r} variant to compare with")
    for v in variants:
        if not 0 <= v["sample"] <= 100:
            raise ValueError(f"{v['name']}: sample {v['sample']} is not a percent")
        if set(v) - {"name", "sample", "env", "sink_down"}:
            raise ValueError(f"{v['name']}: unknown keys {sorted(set(v) - {'name', 'sample', 'env', 'sink_down'})}")


def endpoint_for(sample: float) -> str:
    return "w2-nolog" if sample <= 0 else f"w2-log{sample:g}"


def addresses(kafka: str, otlp: str = "") -> dict[str, str]:
    """What a variant's environment may name as ``{name}``: the live broker, a port nothing listens on, and
    the trace receiver (when one runs)."""
    return {"kafka": kafka, "closed": f"127.0.0.1:{free_port()}", **({"otlp": otlp} if otlp else {})}


def resolve_env(env: dict[str, str], where: dict[str, str]) -> dict[str, str]:
    """The variant's environment with its ``{name}`` addresses filled in; a missing one is an error."""
    try:
        return {k: v.format(**where) for k, v in env.items()}
    except KeyError as exc:
        raise ValueError(f"a variant names the address {exc}, which addresses() does not give") from None


def worker_groups(variants: tuple[dict[str, Any], ...] | list[dict[str, Any]]) -> dict[str, list[str]]:
    """One worker process per distinct environment: its key (the variants' env, as sorted JSON) -> variants."""
    groups: dict[str, list[str]] = {}
    for v in variants:
        groups.setdefault(json.dumps(v["env"], sort_keys=True), []).append(v["name"])
    return groups


# --- the interleaving and its arithmetic -----------------------------------------------------------
def schedule(names: list[str], rounds: int, baseline: str = BASELINE) -> list[tuple[int, str]]:
    """(round, variant) in run order: ``base, A, A, base, B, B, base, ...``; odd rounds take the
    variants in reverse order, and a round after the first starts with the previous round's last base."""
    others = [n for n in names if n != baseline]
    runs: list[tuple[int, str]] = []
    for r in range(rounds):
        if r == 0:
            runs.append((r, baseline))
        for name in (others if r % 2 == 0 else others[::-1]):
            runs += [(r, name), (r, name), (r, baseline)]
    return runs


def ratios(runs: list[dict[str, Any]], key: str = "rps", baseline: str = BASELINE) -> dict[str, list[float]]:
    """Each variant's ratio to the base, once per block of its consecutive runs: the block's mean ``key``
    over the mean of the base runs just before and just after it (either alone at an end)."""
    out: dict[str, list[float]] = {}
    i = 0
    while i < len(runs):
        name = runs[i]["variant"]
        if name == baseline:
            i += 1
            continue
        j = i
        while j < len(runs) and runs[j]["variant"] == name:
            j += 1
        around = [runs[k][key] for k in (i - 1, j) if 0 <= k < len(runs) and runs[k]["variant"] == baseline]
        if around:
            out.setdefault(name, []).append(statistics.mean(r[key] for r in runs[i:j]) / statistics.mean(around))
        i = j
    return out


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.mean(values), "min": min(values), "max": max(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None, "n": len(values)}


def baseline_noise(runs: list[dict[str, Any]], rounds: int, key: str = "rps",
                   baseline: str = BASELINE) -> dict[str, Any]:
    """How far the base moves between consecutive base runs (two variant runs apart): the A/A comparison
    that bounds what a ratio can resolve. ``run_cv``: one run's noise (stdev of the log of those ratios
    over sqrt 2). A block's ratio is 2 runs over 2 runs, so its noise is about one run's: at about 95% it
    tells a difference of ``resolves_one_block`` from none, and the mean of ``rounds`` blocks one of
    ``resolves_mean``."""
    base = [r[key] for r in runs if r["variant"] == baseline]
    steps = [b / a for a, b in zip(base, base[1:])]
    if len(steps) < 2:
        return {"pairs": steps, "run_cv": None}
    cv = statistics.stdev(math.log(s) for s in steps) / math.sqrt(2)
    return {"pairs": steps, "min_pair": min(steps), "max_pair": max(steps), "run_cv": cv,
            "resolves_one_block": 1.96 * cv, "resolves_mean": 1.96 * cv / math.sqrt(max(1, rounds)),
            "rounds": rounds}


def implied_ratio(us_per_request: float, rps: float, cores: int) -> tuple[float, float]:
    """(share of the machine, throughput ratio on a CPU-bound server): ``us_per_request`` more CPU on
    each of ``rps`` requests a second over ``cores``."""
    share = us_per_request * 1e-6 * rps / cores
    return share, 1.0 / (1.0 + share)


def drop_check(status: dict[str, Any], offered: int, bound: int, elsewhere: int = 0) -> dict[str, Any]:
    """A worker logging every request to a sink that never took one: all but ``bound`` were dropped.
    ``offered``: requests its 100% endpoints answered; ``elsewhere``: requests to its endpoints that log
    a share (kept or not by their ids' hash): with any, the expected count is not known exactly."""
    expected = max(0, offered - bound)
    return {"offered": offered, "bound": bound, "expected_dropped": expected, "dropped": status.get("dropped"),
            "queued": status.get("queued"), "written": status.get("written"), "sink_error": status.get("sink_error"),
            "requests_to_sampled_endpoints": elsewhere,
            "exact": elsewhere == 0 and status.get("dropped") == expected
            and status.get("queued") == min(offered, bound) and status.get("written") == 0}

"""``python -m benchmarks.autoscaling [--low-s 40] [--high-s 120] [--tail-s 90]`` (root; the cluster of tests/deploy/kube).

Autoscaled workers against fixed ones, on the real single-node Kubernetes the suite installs on: a load
that rises and falls (closed-loop clients through the workers' Service: 2, then 16, then 2 again) is
replayed three times, each on a fresh install of the chart:

- ``autoscaled``: the workers' HPA on their requests in flight (4 a replica, 1 to 4 replicas;
  registry/autoscaling/ serving the external metrics API);
- ``fixed-min``: 1 worker throughout; ``fixed-max``: 4 workers throughout.

The endpoint holds each request 0.25 s in the user's code (tests/deploy/kube/autoscaling_load.py): a worker
runs 8 such calls at once, so 16 clients on one worker wait twice as long as on two or more. Compared, as
ratios to ``fixed-max`` within this run: p99 of the high phase once the scale-up has landed (from the first
second 4 workers were ready, for every variant the same span), requests lost, and replica-minutes
(ready worker pods integrated over the replay). Beside them, the replica-minutes of an ideal autoscaler
(ceil(clients / 4) workers at every instant, no lag): the least any autoscaler could use on this profile,
so a profile whose peak is most of its length cannot meet a replica-minutes target at all (40/120/90 s:
the ideal is 0.61 of fixed-max). The issue's target: p99 within 2x of ``fixed-max`` after the scale-up,
at no more than 60% of its replica-minutes, with zero lost. Prints a table; writes
``results/autoscaling.json`` and ``results/autoscaling.png`` (replicas and p99 over time).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tests.deploy.kube.autoscaling_load import Clients, Watch, autoscaling_values, deploy_hold, percentile_ms
from tests.deploy.kube.conftest import start_cluster, stop_cluster
from tests.deploy.kube.helm_release import images_in_node, installed

RESULTS = Path(__file__).parent / "results"
console = Console()
VARIANTS: dict[str, dict] = {
    "autoscaled": autoscaling_values(per_replica=4, most=4),
    "fixed-min": {"worker": {"replicas": 1}},
    "fixed-max": {"worker": {"replicas": 4}},
}


def replay(release, low_s: float, high_s: float, tail_s: float, autoscaled: bool) -> dict[str, Any]:
    """The load's three steps; the samples and every request's (start, latency, outcome), times from its start."""
    clients = Clients(release).start(16)
    try:
        with Watch(release, clients, metric=autoscaled) as watch:
            t0 = time.monotonic()
            for count, seconds in ((2, low_s), (16, high_s), (2, tail_s)):
                clients.count = count
                time.sleep(seconds)
    finally:
        clients.stop()
    return {"samples": [[s.t - t0, s.clients, s.desired, s.ready, s.metric] for s in watch.samples],
            "requests": [[t - t0, latency, outcome] for t, latency, outcome in clients.results]}


def summary(run: dict[str, Any], high: tuple[float, float]) -> dict[str, Any]:
    samples, requests = run["samples"], run["requests"]
    replica_s = sum(ready * (b[0] - a[0]) for a, b in zip(samples, samples[1:]) for ready in [a[3]])
    in_high = [lat for t, lat, _ in requests if high[0] <= t <= high[1]]
    return {"requests": len(requests), "lost": sum(1 for *_, o in requests if o != "ok"),
            "p99_ms": percentile_ms([lat for _, lat, _ in requests], 99),
            "p99_high_after_scale_up_ms": percentile_ms(in_high, 99), "replica_minutes": replica_s / 60,
            "max_ready": max(s[3] for s in samples)}


def landed(run: dict[str, Any], low_s: float, most: int) -> float:
    """When the autoscaled workers first stood at ``most`` ready after the rise (seconds from the start)."""
    return next(s[0] for s in run["samples"] if s[0] >= low_s and s[3] >= most)


def plot(runs: dict[str, dict[str, Any]], path: Path, low_s: float, high_s: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    for name, run in runs.items():
        top.step([s[0] for s in run["samples"]], [s[3] for s in run["samples"]], where="post", label=name)
        window: dict[int, list[float]] = {}
        for t, lat, _ in run["requests"]:
            window.setdefault(int(t // 5) * 5, []).append(lat)
        xs = sorted(window)
        bottom.plot(xs, [percentile_ms(window[x], 99) for x in xs], marker=".", label=name)
    for ax in (top, bottom):
        ax.axvspan(low_s, low_s + high_s, color="0.92", zorder=0)
        ax.legend()
    top.set_ylabel("ready workers")
    bottom.set_ylabel("p99 of 5 s (ms)")
    bottom.set_xlabel("seconds (grey: 16 clients; else 2)")
    fig.suptitle("Workers autoscaled on requests in flight vs fixed (single-node Kubernetes 1.20)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--low-s", type=float, default=60)
    parser.add_argument("--high-s", type=float, default=90)
    parser.add_argument("--tail-s", type=float, default=150)
    args = parser.parse_args()
    runs: dict[str, dict[str, Any]] = {}
    cluster = start_cluster()
    try:
        with images_in_node(cluster) as names:
            for name, extra in VARIANTS.items():
                with tempfile.TemporaryDirectory(prefix="serving-bench-autoscaling-") as tmp, \
                        installed(cluster, names, Path(tmp), extra) as release:
                    deploy_hold(release, Path(tmp))
                    console.print(f"[bold]{name}[/bold]: replaying 2 -> 16 -> 2 clients")
                    runs[name] = replay(release, args.low_s, args.high_s, args.tail_s, name == "autoscaled")
    finally:
        stop_cluster(cluster)
    high = (landed(runs["autoscaled"], args.low_s, 4), args.low_s + args.high_s)
    results = {name: summary(run, high) for name, run in runs.items()}
    base = results["fixed-max"]
    ideal = (args.low_s + 4 * args.high_s + args.tail_s) / 60  # ceil(2 / 4) = 1 worker, ceil(16 / 4) = 4
    results["ideal (computed)"] = {"requests": 0, "lost": 0, "p99_ms": float("nan"),
                                   "p99_high_after_scale_up_ms": float("nan"), "replica_minutes": ideal,
                                   "max_ready": 4}
    for r in results.values():
        r["p99_high_ratio_to_fixed_max"] = r["p99_high_after_scale_up_ms"] / base["p99_high_after_scale_up_ms"]
        r["replica_minutes_ratio_to_fixed_max"] = r["replica_minutes"] / base["replica_minutes"]
    table = Table(title=f"2 -> 16 -> 2 clients ({args.low_s:.0f} s, {args.high_s:.0f} s, {args.tail_s:.0f} s); "
                        f"scale-up landed at {high[0]:.0f} s")
    for column in ("variant", "requests", "lost", "p99 (ms)", "p99 high, after scale-up (ms)", "x fixed-max",
                   "replica-minutes", "x fixed-max"):
        table.add_column(column, justify="right")
    for name, r in results.items():
        table.add_row(name, str(r["requests"] or "-"), str(r["lost"]), f"{r['p99_ms']:.0f}",
                      f"{r['p99_high_after_scale_up_ms']:.0f}", f"{r['p99_high_ratio_to_fixed_max']:.2f}",
                      f"{r['replica_minutes']:.1f}", f"{r['replica_minutes_ratio_to_fixed_max']:.2f}")
    console.print(table)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "autoscaling.json").write_text(json.dumps(
        {"args": vars(args), "scale_up_landed_s": high[0], "results": results, "runs": runs}, indent=1) + "\n")
    plot(runs, RESULTS / "autoscaling.png", args.low_s, args.high_s)
    console.print(f"wrote {RESULTS / 'autoscaling.json'} and {RESULTS / 'autoscaling.png'}")


if __name__ == "__main__":
    main()

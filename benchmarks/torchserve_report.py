"""The TorchServe benchmark's report: each system's recorded levels against TorchServe's best at the same
client count, the issue's targets, the rich tables, the markdown (results/torchserve.md) and the plot
(results/torchserve.png), from a run's figures (benchmarks/torchserve.py measures them)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from benchmarks.report import rich_table

console = Console(width=160)
TARGETS = {"platform": 1.5, "platform-onnx": 3.0}  # x TorchServe's requests/s, at every client count
BASELINE = "torchserve"
TUNED = "torchserve-1thread"


def ratio_rows(result: dict) -> list[dict]:
    """Every recorded level with its ratios: ``x_torchserve`` over TorchServe's best configuration of
    workers and batching at that client count (the issue's baseline), ``x_torchserve_any`` over the
    best TorchServe including one thread per backend worker."""
    rows = []
    for workload, data in result["workloads"].items():
        by = {(lv["system"], lv["concurrency"]): lv for lv in data.get("levels", [])}
        for lv in data.get("levels", []):
            base = by.get((BASELINE, lv["concurrency"]))
            tuned = by.get((TUNED, lv["concurrency"]))
            best = max((x["rps"] for x in (base, tuned) if x), default=None)
            rows.append({"workload": workload, **{k: lv[k] for k in (
                "system", "variant", "label", "concurrency", "rps", "p50_ms", "p99_ms", "cpu_ms_per_request",
                "passes_rps", "foreign_cpu_share", "errors")},
                "x_torchserve": lv["rps"] / base["rps"] if base and base["rps"] else None,
                "x_torchserve_any": lv["rps"] / best if best else None,
                "cpu_x_torchserve": lv["cpu_ms_per_request"] / base["cpu_ms_per_request"]
                if base and base["cpu_ms_per_request"] else None})
    return rows


def answers_of(data: dict, system: str) -> dict[str, Any]:
    """Whether every configuration of ``system`` answered as TorchServe did, and the largest difference."""
    checks = [c for c in (data.get("answers") or {}).get("checks", []) if c["system"] == system]
    diffs = [c["max_abs_diff"] for c in checks if c.get("max_abs_diff") is not None]
    return {"checked": len(checks), "equal": bool(checks) and all(c["equal"] for c in checks),
            "max_abs_diff": max(diffs) if diffs else None}


def targets(result: dict, rows: list[dict]) -> list[dict]:
    """The issue's targets per workload and client count: the platform with the handler as it is at
    least 1.5x TorchServe's requests/s, with ONNX Runtime at least 3x with the same answers."""
    out = []
    for workload, data in result["workloads"].items():
        for system, bar in TARGETS.items():
            checked = answers_of(data, system)
            for row in (r for r in rows if r["workload"] == workload and r["system"] == system):
                ratio = row["x_torchserve"]
                met = ratio is not None and ratio >= bar and (system != "platform-onnx" or checked["equal"])
                out.append({"workload": workload, "system": system, "clients": row["concurrency"], "target": bar,
                            "ratio": ratio, "answers_equal": checked["equal"],
                            "max_abs_diff": checked["max_abs_diff"], "met": met})
            if not any(r["workload"] == workload and r["system"] == system for r in rows):
                why = result.get("unavailable", {}).get(system) or data.get("failed", {}).get(system) or "not run"
                out.append({"workload": workload, "system": system, "clients": None, "target": bar, "ratio": None,
                            "met": None, "why": why})
    return out


def summarize(result: dict) -> dict:
    rows = ratio_rows(result)
    return {"rows": rows, "targets": targets(result, rows)}


def _num(value: Any, fmt: str = ".1f") -> str:
    return "" if value is None else format(value, fmt)


HEADERS = ["workload", "clients", "system", "best configuration", "req/s", "p50 ms", "p99 ms", "CPU ms/req",
           "x TorchServe", "x best TorchServe", "CPU x TorchServe", "foreign CPU"]


def table_rows(result: dict) -> list[list[str]]:
    rows = []
    for r in result["summary"]["rows"]:
        rows.append([r["workload"], str(r["concurrency"]), r["system"], r["label"], _num(r["rps"]), _num(r["p50_ms"]),
                     _num(r["p99_ms"]), _num(r["cpu_ms_per_request"], ".2f"), _num(r["x_torchserve"], ".2f"),
                     _num(r["x_torchserve_any"], ".2f"), _num(r["cpu_x_torchserve"], ".2f"),
                     f"{r['foreign_cpu_share']:.0%}"])
    for workload, data in result["workloads"].items():
        for runtime, best in (data.get("ceiling") or {}).items():
            if runtime == "runs":
                continue
            rows.append([workload, "-", f"ceiling ({runtime})", best["name"], _num(best["rps"]), "", "",
                         _num(best["cpu_ms_per_request"], ".2f"), "", "", "", ""])
    return rows


TARGET_HEADERS = ["workload", "system", "clients", "x TorchServe", "target", "same answers (largest difference)", "met"]


def target_rows(result: dict) -> list[list[str]]:
    rows = []
    for t in result["summary"]["targets"]:
        if t["clients"] is None:
            rows.append([t["workload"], t["system"], "-", "", f">= {t['target']:g}", "", f"not measured: {t['why']}"])
            continue
        same = "yes" if t["answers_equal"] else "NO"
        rows.append([t["workload"], t["system"], str(t["clients"]), _num(t["ratio"], ".2f"), f">= {t['target']:g}",
                     f"{same} ({_num(t['max_abs_diff'], '.1e')})", "yes" if t["met"] else "no"])
    return rows


def print_tables(result: dict) -> None:
    console.print(rich_table(f"TorchServe against the platform: {result['machine']['cpu']}, "
                             f"{result['machine']['cores']} cores, load {result['load_average']['before']} -> "
                             f"{result['load_average']['after']}", HEADERS, table_rows(result)))
    console.print(rich_table("targets", TARGET_HEADERS, target_rows(result)))


def markdown(result: dict) -> str:
    m = result["machine"]
    lines = [f"TorchServe {m['torchserve']} ({m['java']}) against the platform (commit {m['commit']}), {m['cpu']}, "
             f"{m['cores']} cores, torch {m['torch']}, onnxruntime {m['onnxruntime']}, {result['date']}, load average "
             f"{result['load_average']['before']} before and {result['load_average']['after']} after, "
             f"{result['wall_s']:.0f} s; `{result['command']}`", "",
             "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    lines += ["", "| " + " | ".join(TARGET_HEADERS) + " |", "|" + "---|" * len(TARGET_HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in target_rows(result)]
    lines += ["", "| workload | system | configuration | answers as TorchServe's | largest difference | same bytes |",
              "|---|---|---|---|---|---|"]
    for workload, data in result["workloads"].items():
        for c in (data.get("answers") or {}).get("checks", []):
            lines.append(f"| {workload} | {c['system']} | {c['variant']} | {'yes' if c['equal'] else 'NO: ' + str(c['problem'])} "
                         f"| {_num(c['max_abs_diff'], '.1e')} | {'yes' if c['identical'] else 'no'} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Per workload: requests/s (the ceilings as lines), p99 and CPU a request against clients."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(result["workloads"])
    fig, axes = plt.subplots(len(workloads), 3, figsize=(16, 4.2 * len(workloads)), squeeze=False)
    systems = list(dict.fromkeys(r["system"] for r in result["summary"]["rows"]))
    colour = {system: f"C{i}" for i, system in enumerate(systems)}
    for row_axes, workload in zip(axes, workloads):
        data = result["workloads"][workload]
        for system in systems:
            points = sorted((r["concurrency"], r) for r in result["summary"]["rows"]
                            if r["workload"] == workload and r["system"] == system)
            if not points:
                continue
            xs = [p[0] for p in points]
            for ax, key in zip(row_axes, ("rps", "p99_ms", "cpu_ms_per_request")):
                ax.plot(xs, [p[1][key] for p in points], marker="o", color=colour[system], label=system)
        for runtime, style in (("torch", "--"), ("onnx", ":")):
            best = (data.get("ceiling") or {}).get(runtime)
            if best:
                row_axes[0].axhline(best["rps"], color="grey", linestyle=style, label=f"ceiling, {runtime}")
                row_axes[2].axhline(best["cpu_ms_per_request"], color="grey", linestyle=style,
                                    label=f"ceiling, {runtime}")
        titles = ("requests/s (higher is better)", "p99 ms (lower is better)", "CPU ms a request, all its processes")
        for ax, title in zip(row_axes, titles):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("clients")
            ax.set_title(f"{workload}: {title}")
            ax.legend(fontsize=7)
        for ax in row_axes:  # the ceilings can be ten times the HTTP systems (mnist): log scales keep both readable
            ax.set_yscale("log")
    fig.suptitle(f"TorchServe {result['machine']['torchserve']} against the platform: {result['machine']['cpu']}, "
                 f"{result['machine']['cores']} cores, {result['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

"""Turn a RunResult into what people read: a terminal table, markdown, a PNG, and the target checks.

The checks restate the issue's targets with numbers from the same run, so a
reader of docs/benchmarks.md sees at once what is met and by how much.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from rich.console import Console
from rich.table import Table

from benchmarks.results import CEILING, RunResult, finite

ECHO_OTHERS = ("litserve", "mlserver", "bentoml")
STATS_PAIRS = (("platform-ort-1w", "platform-ort-1w-nostats"),
               ("platform-triton-batch-1w", "platform-triton-batch-1w-nostats"))


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def summary_rows(run: RunResult) -> list[dict[str, Any]]:
    """One row per system: its best level (highest req/s) and the ratios."""
    rows = []
    for r in run.results:
        best = r.best
        rows.append({
            "workload": r.workload, "system": r.system, "label": r.label, "status": r.status,
            "level": None if best is None else best.name,
            "rps": None if best is None else best.rps,
            "p50": None if best is None else best.p50_ms, "p95": None if best is None else best.p95_ms,
            "p99": None if best is None else best.p99_ms, "errors": r.errors,
            "x_ceiling": r.ratio_ceiling, "x_baseline": r.ratio_baseline, "reason": r.reason,
        })
    return rows


def checks(run: RunResult) -> list[dict[str, Any]]:
    """The issue's targets, evaluated on this run's numbers (absent systems give no check)."""
    out: list[dict[str, Any]] = []
    by = {(r.workload, r.system): r for r in run.results if r.best_rps}
    w2 = [r for (w, _), r in by.items() if w == "W2" and r.system.startswith("platform-")]
    # The ceiling and the baseline run the model as exported; an --optimize'd model is another
    # model (int8 changes some predictions), so it is checked apart and said to be.
    same = [r for r in w2 if not r.details.get("upload_options")]
    optimized = [r for r in w2 if r.details.get("upload_options")]
    if same:
        best = max(same, key=lambda r: r.best_rps)
        if best.ratio_ceiling is not None:
            out.append({"target": "W2: platform >= 90% of the ceiling (same model)", "system": best.system,
                        "value": best.ratio_ceiling, "met": best.ratio_ceiling >= 0.9})
        if best.ratio_baseline is not None:
            out.append({"target": "W2: platform >= 2.5x the FastAPI baseline (same model)", "system": best.system,
                        "value": best.ratio_baseline, "met": best.ratio_baseline >= 2.5})
    if optimized:
        best = max(optimized, key=lambda r: r.best_rps)
        if best.ratio_baseline is not None:
            agree = best.details.get("label_agreement")
            note = f", label agreement {agree:.1%}" if agree is not None else ""
            out.append({"target": f"W2: platform >= 2.5x the FastAPI baseline (optimized model{note})",
                        "system": best.system, "value": best.ratio_baseline, "met": best.ratio_baseline >= 2.5})
    echo = [r for (w, _), r in by.items() if w == "W0" and r.system.startswith("platform-echo")]
    others = [r for (w, _), r in by.items() if w == "W0" and r.system in ECHO_OTHERS]
    if echo and others:
        best, rival = max(echo, key=lambda r: r.best_rps), max(others, key=lambda r: r.best_rps)
        ratio = best.best_rps / rival.best_rps
        out.append({"target": f"W0: platform echo >= 1.2x the best of LitServe, MLServer, BentoML ({rival.system})",
                    "system": best.system, "value": ratio, "met": ratio >= 1.2})
        p99 = best.best.p99_ms / rival.best.p99_ms
        out.append({"target": f"W0: platform echo p99 no worse than {rival.system}'s (ratio of p99s)",
                    "system": best.system, "value": p99, "met": p99 <= 1.0})
    triton = by.get(("W1", "triton-tokenizer-batch"))
    w1 = [r for (w, _), r in by.items() if w == "W1" and r.system.startswith("platform-triton-batch")
          and r.system not in {off for _, off in STATS_PAIRS}]
    if triton and w1:
        best = max(w1, key=lambda r: r.best_rps)
        ratio = best.best_rps / triton.best_rps
        out.append({"target": "W1: platform (batching on) beats Triton + tokenizer inside (batching on)",
                    "system": best.system, "value": ratio, "met": ratio > 1.0})
    for workload in sorted({w for w, _ in by}):
        for on, off in STATS_PAIRS:
            if (workload, on) in by and (workload, off) in by:
                cost = 1.0 - by[(workload, on)].best_rps / by[(workload, off)].best_rps
                out.append({"target": f"{workload}: statistics overhead < 5% ({on} vs statistics off)",
                            "system": on, "value": cost, "met": cost < 0.05})
    return out


def write_outputs(out: Path, name: str, result: dict, markdown: Callable[[dict], str],
                  plot: Callable[[dict, Path], None], console: Console) -> None:
    """A benchmark's record: ``name``.json (the figures, NaN as null), .md (its tables) and .png (its plot)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(finite(result), indent=1))
    (out / f"{name}.md").write_text(markdown(result))
    plot(result, out / f"{name}.png")
    console.print(f"wrote {out}/{name}.json, .md, .png in {result['wall_s']:.0f} s")


def rich_table(title: str, headers: Sequence[str], rows: Iterable[Sequence[str]]) -> Table:
    """A titled table of text rows, for a benchmark's printout."""
    table = Table(title=title)
    for header in headers:
        table.add_column(header)
    for row in rows:
        table.add_row(*row)
    return table


def print_table(run: RunResult, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"benchmarks ({run.mode}): best level of each system")
    for col in ("workload", "system", "best at", "req/s", "p50 ms", "p95 ms", "p99 ms", "errors", "x ceiling",
                "x baseline"):
        table.add_column(col, justify="left" if col in ("workload", "system", "best at") else "right")
    for row in summary_rows(run):
        name = row["system"] if row["status"] == "ok" else f"{row['system']} ({row['status']})"
        table.add_row(row["workload"], name, row["level"] or "-", _fmt(row["rps"]), _fmt(row["p50"]),
                      _fmt(row["p95"]), _fmt(row["p99"]), str(row["errors"]), _fmt(row["x_ceiling"], ".2f", "x"),
                      _fmt(row["x_baseline"], ".2f", "x"))
    console.print(table)
    for check in checks(run):
        mark = "[green]met[/green]" if check["met"] else "[red]missed[/red]"
        console.print(f"{mark} {check['target']}: {check['value']:.3f} ({check['system']})")
    for problem in run.invalid:
        console.print(f"[bold red]RUN INVALID[/bold red]: {problem}")


def markdown(run: RunResult) -> str:
    lines = [f"# Benchmark results ({run.mode})", "", f"Command: `{run.command}`  ", f"Started: {run.started_at}  ",
             f"Machine: {run.machine.get('summary', '')}  ",
             f"Corpus: {run.corpus.get('size')} texts of {run.corpus.get('words')} words, seed {run.corpus.get('seed')}",
             *([""] + [f"**RUN INVALID**: {p}  " for p in run.invalid] if run.invalid else []),
             "", "## Best level of each system", "",
             "| workload | system | best at | req/s | p50 ms | p95 ms | p99 ms | errors | x ceiling | x baseline |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in summary_rows(run):
        name = row["system"] if row["status"] == "ok" else f"{row['system']} ({row['status']}: {row['reason']})"
        lines.append(f"| {row['workload']} | {name} | {row['level'] or '-'} | {_fmt(row['rps'])} | {_fmt(row['p50'])} "
                     f"| {_fmt(row['p95'])} | {_fmt(row['p99'])} | {row['errors']} | {_fmt(row['x_ceiling'], '.2f')} "
                     f"| {_fmt(row['x_baseline'], '.2f')} |")
    lines += ["", "## Targets", "", "| target | system | value | met |", "|---|---|---:|---|"]
    for check in checks(run):
        lines.append(f"| {check['target']} | {check['system']} | {check['value']:.3f} | {'yes' if check['met'] else 'no'} |")
    lines += ["", "## Every level", "", "| workload | system | level | requests | req/s | p50 ms | p95 ms | p99 ms | errors |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in run.results:
        for lv in r.levels:
            lines.append(f"| {r.workload} | {r.system} | {lv.name} | {lv.requests} | {lv.rps:.1f} | {lv.p50_ms:.1f} "
                         f"| {lv.p95_ms:.1f} | {lv.p99_ms:.1f} | {lv.errors + lv.warmup_errors} |")
    lines += ["", "Systems:", ""]
    for system, label in dict((r.system, r.label) for r in run.results).items():
        lines.append(f"- `{system}`: {label}")
    agreements = [r for r in run.results if "label_agreement" in r.details]
    if agreements:
        lines += ["", "Optimized models: predicted label equal to the unoptimized model's, over HTTP on corpus texts:", ""]
        lines += [f"- {r.workload} `{r.system}`: {r.details['label_agreement']:.1%}" for r in agreements]
    return "\n".join(lines) + "\n"


def plot(run: RunResult, path: Path) -> None:
    """Per workload: throughput and p99 against concurrency; the ceiling as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = sorted({r.workload for r in run.results})
    fig, axes = plt.subplots(len(workloads), 2, figsize=(13, 4.5 * len(workloads)), squeeze=False)
    for row, workload in enumerate(workloads):
        ax_rps, ax_p99 = axes[row]
        colors = iter(plt.get_cmap("tab20").colors)  # more systems than tab10 has colours
        for r in (r for r in run.results if r.workload == workload and r.levels):
            if r.system == CEILING:
                ax_rps.axhline(r.best_rps, color="black", linestyle="--", label=f"ceiling ({r.best.name})")
                continue
            xs = [lv.concurrency for lv in r.levels]
            style = "-o" if r.system.startswith("platform") else "--s"
            color = next(colors)
            ax_rps.plot(xs, [lv.rps for lv in r.levels], style, label=r.system, color=color)
            ax_p99.plot(xs, [lv.p99_ms for lv in r.levels], style, label=r.system, color=color)
        for ax, ylabel in ((ax_rps, "requests/s"), (ax_p99, "p99 latency (ms)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent clients (closed loop)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{workload}: {ylabel}")
            ax.grid(True, alpha=0.3)
        ax_p99.set_yscale("log")
        ax_rps.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


def write_all(run: RunResult, out_dir: Path) -> dict[str, Path]:
    """``<mode>.json``, ``<mode>.md`` and ``<mode>.png`` in ``out_dir``, each written whole (tmp + rename)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {ext: out_dir / f"{run.mode}.{ext}" for ext in ("json", "md", "png")}
    data = run.to_json()
    data["checks"] = checks(run)
    _write(paths["json"], json.dumps(data, indent=2))
    _write(paths["md"], markdown(run))
    tmp = paths["png"].with_suffix(".png.tmp")
    plot(run, tmp)
    tmp.replace(paths["png"])
    return paths


def _write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)

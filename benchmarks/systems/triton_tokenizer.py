"""Triton alone, the tokenizer inside it as one Python model (one instance) before the ONNX model.

The design the published comparisons measure: clients send raw text to Triton,
and a single Python-backend model instance tokenizes and runs the model, so with
dynamic batching on every request still funnels through that one instance. It
uses the same real tritonserver, started the same way, as the platform's embedded
Triton (serving/triton/python_backend.py: the tritonserver of nvidia-pytriton,
Triton's own Python backend, no PyTriton proxy; the model.py is
benchmarks/systems/triton_tokenizer_model.py), so the comparison is like for like.
With batching on, the one instance tokenizes and runs whole batches (the kinder
variant for Triton). Run alone:
``python -m benchmarks.systems.triton_tokenizer --onnx F --tokenizer D --http-port P --batching on``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Iterator

from benchmarks.procs import free_port, process, wait_http
from benchmarks.systems.base import RunContext, System, Target

NAME = "triton-tokenizer"
MODEL = "text_classifier"
MAX_BATCH = 32
QUEUE_DELAY_US = 2000
VARIANTS = {f"{NAME}-nobatch": False, f"{NAME}-batch": True}
MODEL_PY = Path(__file__).with_name("triton_tokenizer_model.py")


def config_pbtxt(onnx_path: Path, tokenizer_dir: Path, batching: bool) -> str:
    """One instance; BYTES ``text`` in, ``logits`` out; validated against Triton's schema."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from benchmarks.workloads import MAX_LENGTH
    from serving.triton.repository import validate_config_pbtxt

    cfg = mc.ModelConfig(name=MODEL, backend="python", max_batch_size=MAX_BATCH if batching else 0)
    if batching:
        cfg.dynamic_batching.max_queue_delay_microseconds = QUEUE_DELAY_US
    cfg.instance_group.add(count=1, kind=mc.ModelInstanceGroup.KIND_CPU)
    cfg.input.add(name="text", data_type=mc.TYPE_STRING, dims=[1])
    cfg.output.add(name="logits", data_type=mc.TYPE_FP32, dims=[-1] if batching else [-1, -1])
    for key, value in {"onnx": str(onnx_path), "tokenizer": str(tokenizer_dir), "max_length": str(MAX_LENGTH)}.items():
        cfg.parameters[key].string_value = value
    text = text_format.MessageToString(cfg)
    validate_config_pbtxt(text)
    return text


def serve(onnx_path: Path, tokenizer_dir: Path, http_port: int, batching: bool) -> None:
    """Load the one model into a real tritonserver and serve until SIGTERM."""
    import subprocess

    import httpx

    from serving.triton.python_backend import ACCESS_HEADER, server_command, start_server

    workspace = Path(tempfile.gettempdir()) / f"bench-triton-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    version_dir = workspace / "models" / MODEL / "1"
    version_dir.mkdir(parents=True)
    shutil.copy(MODEL_PY, version_dir / "model.py")
    (version_dir.parent / "config.pbtxt").write_text(config_pbtxt(onnx_path.resolve(), tokenizer_dir.resolve(), batching))
    cmd = server_command(workspace, workspace / "models", "127.0.0.1", http_port, free_port(), free_port())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = start_server(cmd)
    try:
        base = f"http://127.0.0.1:{http_port}"
        for _ in range(600):
            try:
                if httpx.get(f"{base}/v2/health/live", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or stop.wait(0.2):
                return
        httpx.post(f"{base}/v2/repository/models/{MODEL}/load", headers={ACCESS_HEADER: cmd.token},
                   json={}, timeout=300).raise_for_status()
        while not stop.wait(0.5) and server.poll() is None:
            pass
    finally:
        if server.poll() is None:
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
        shutil.rmtree(workspace, ignore_errors=True)


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

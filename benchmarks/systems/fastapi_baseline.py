"""The baseline users know: a plain FastAPI app around a ``transformers`` pipeline (PyTorch).

Deliberately what a team writes first: one uvicorn process, one pipeline, one
text per request, no batching, no ONNX. It loads the very torch model the ONNX
file was exported from (``save_pretrained`` copy, no hub), so only the serving
differs. Run alone: ``python -m benchmarks.systems.fastapi_baseline --model DIR --port P``.
"""
from __future__ import annotations

import argparse
from typing import Iterator

from pydantic import BaseModel

from benchmarks.procs import free_port, process, wait_http
from benchmarks.systems.base import RunContext, System, Target
from benchmarks.workloads import MAX_LENGTH

NAME = "fastapi-baseline"


class Body(BaseModel):
    """The request: one text (module level, so FastAPI resolves the annotation as a JSON body)."""

    text: str


def create_app(model_dir: str):
    """``POST /classify {"text": ...}`` -> ``{"label", "score"}``, as a pipeline returns them."""
    from fastapi import FastAPI
    from transformers import pipeline

    classifier = pipeline("text-classification", model=model_dir, tokenizer=model_dir, device="cpu")
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/classify")
    def classify(body: Body) -> dict:
        # A sync handler: FastAPI runs it in its thread pool, the usual way to wrap blocking torch code.
        return classifier(body.text, truncation=True, max_length=MAX_LENGTH)[0]

    return app


def targets(ctx: RunContext) -> Iterator[Target]:
    port = free_port()
    args = ["-m", "benchmarks.systems.fastapi_baseline", "--model", str(ctx.workload.hf_dir), "--port", str(port)]
    with process(args, ctx.log_dir / f"{NAME}.log") as proc:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=180, procs=[proc])
        yield Target(NAME, "FastAPI + transformers pipeline (PyTorch), 1 process", f"http://127.0.0.1:{port}/classify",
                     "text_json", procs=[proc])


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(description="FastAPI + transformers pipeline baseline")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.model), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


SYSTEM = System(NAME, "plain FastAPI + transformers pipeline (PyTorch), one process", variants=(NAME,),
                targets=targets)

if __name__ == "__main__":
    main()

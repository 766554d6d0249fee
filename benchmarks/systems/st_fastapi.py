"""The baseline embedding users write first: sentence-transformers behind a plain FastAPI app.

One uvicorn process, one ``SentenceTransformer`` (PyTorch, CPU), OpenAI's ``POST /v1/embeddings``
shape so the same requests go to every system; a sync handler (FastAPI's thread pool), each request
encoded on its own (``encode(texts, batch_size=32)``), no batching across requests. The very folder
the other systems serve. Run alone: ``python -m benchmarks.systems.st_fastapi --model DIR --port P``.
"""
from __future__ import annotations

import argparse
from typing import Union

from pydantic import BaseModel


class Body(BaseModel):
    model: str = ""
    input: Union[str, list[str]]
    encoding_format: str = "float"


def create_app(model_dir: str):
    from fastapi import FastAPI
    from sentence_transformers import SentenceTransformer

    encoder = SentenceTransformer(model_dir, device="cpu", local_files_only=True)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    @app.post("/v1/embeddings")
    def embeddings(body: Body) -> dict:
        texts = [body.input] if isinstance(body.input, str) else body.input
        vectors = encoder.encode(texts, batch_size=32, convert_to_numpy=True)
        return {"object": "list", "model": body.model,
                "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}

    return app


def main(argv: list[str] | None = None) -> None:
    import uvicorn

    p = argparse.ArgumentParser(description="sentence-transformers behind FastAPI")
    p.add_argument("--model", required=True)
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    uvicorn.run(create_app(args.model), host="127.0.0.1", port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()

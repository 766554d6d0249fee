"""The embeddings ceiling: onnxruntime in one process, no HTTP, tokenization, mean pooling and
normalization included, at the best batch size and thread layout (benchmarks/systems/ceiling.py's
loop and layouts, with this batch work). What the hardware gives for MiniLM-L6 sentence embeddings;
a server's sentences/s over it is the share it keeps. Run as a child process:
``python -m benchmarks.systems.embedding_ceiling --onnx F --tokenizer DIR --corpus C``.
"""
from __future__ import annotations

import json

import numpy as np

from benchmarks.systems.ceiling import run_levels
from preprocess.pooling import mean, normalize

MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length: what every system truncates at


def embed(sess, tok, texts: list[str]) -> np.ndarray:
    """Texts -> unit-length mean-pooled vectors, as sentence-transformers' all-MiniLM-L6-v2 computes them."""
    enc = tok(texts, padding="longest", truncation=True, max_length=MAX_LENGTH, return_tensors="np")
    wanted = {i.name for i in sess.get_inputs()}
    (hidden,) = sess.run(["last_hidden_state"], {k: v.astype(np.int64) for k, v in enc.items() if k in wanted})
    return normalize(mean(hidden, enc["attention_mask"]))


def main(argv: list[str] | None = None) -> None:
    out = run_levels(argv, "in-process onnxruntime ceiling of sentence embeddings", "1,8,32,64", 3.0, infer=embed)
    print(json.dumps({"levels": out["levels"]}))

if __name__ == "__main__":
    main()

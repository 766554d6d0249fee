"""The embeddings ceiling: onnxruntime in one process, no HTTP, tokenization, mean pooling and
normalization included, at the best batch size and thread layout (benchmarks/systems/ceiling.py's
loop and layouts, with this batch work). What the hardware gives for MiniLM-L6 sentence embeddings;
a server's sentences/s over it is the share it keeps. Run as a child process:
``python -m benchmarks.systems.embedding_ceiling --onnx F --tokenizer DIR --corpus C``.

Batches are taken two ways: consecutive sentences of the corpus (padded to their longest), and the
corpus sorted by length first, so a batch holds sentences of about one length and computes almost no
padding. The second is what a server that groups waiting sentences by length can reach (the
platform's token batcher does: serving/embeddings/token_batcher.py); a ceiling without it is one such a
server beats, as the first recorded runs showed (1.3x "the ceiling" at 32 clients).
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.corpus import read_corpus
from benchmarks.systems.ceiling import run_levels
from preprocess.pooling import mean, normalize

MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length: what every system truncates at


def embed(sess, tok, texts: list[str]) -> np.ndarray:
    """Texts -> unit-length mean-pooled vectors, as sentence-transformers' all-MiniLM-L6-v2 computes them."""
    enc = tok(texts, padding="longest", truncation=True, max_length=MAX_LENGTH, return_tensors="np")
    wanted = {i.name for i in sess.get_inputs()}
    (hidden,) = sess.run(["last_hidden_state"], {k: v.astype(np.int64) for k, v in enc.items() if k in wanted})
    return normalize(mean(hidden, enc["attention_mask"]))


def by_length(corpus: Path, tokenizer_dir: Path, out: Path) -> Path:
    """The corpus sorted by token count, shortest first: consecutive batches of it are near-equal in length."""
    from transformers import AutoTokenizer

    texts = read_corpus(corpus)
    lengths = [len(ids) for ids in AutoTokenizer.from_pretrained(str(tokenizer_dir))(texts)["input_ids"]]
    out.write_text(json.dumps([t for _, t in sorted(zip(lengths, texts), key=lambda p: p[0])]))
    return out


def _arg(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _pop(argv: list[str], name: str) -> str | None:
    if name not in argv:
        return None
    i = argv.index(name)
    value = argv[i + 1]
    del argv[i:i + 2]
    return value


def main(argv: list[str] | None = None) -> None:
    """Every batch size, thread layout and order; or, given ``--order as-sent|by-length``, ``--batch-sizes B``
    and ``--layout TxS``, that one configuration (the benchmark measures the best one again beside each
    level, so a platform's rate and the ceiling's are taken minutes apart, not a quarter of an hour)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    order = _pop(argv, "--order")
    description = "in-process onnxruntime ceiling of sentence embeddings"
    levels = []
    if order in (None, "as-sent"):
        levels += [{**lv, "order": "as sent"} for lv in run_levels(argv, description, "1,8,32,64", 3.0, infer=embed)["levels"]]
    if order in (None, "by-length"):
        sizes = [] if order and "--batch-sizes" in argv else ["--batch-sizes", "8,32,64"]
        with tempfile.TemporaryDirectory() as tmp:
            i = argv.index("--corpus")
            argv[i + 1] = str(by_length(Path(argv[i + 1]), Path(_arg(argv, "--tokenizer")), Path(tmp) / "sorted.json"))
            levels += [{**lv, "order": "by length"} for lv in
                       run_levels([*argv, *sizes], description, "8,32,64", 3.0, infer=embed)["levels"]]
    print(json.dumps({"levels": levels}))


if __name__ == "__main__":
    main()

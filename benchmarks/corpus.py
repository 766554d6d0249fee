"""Fixed-seed corpus of texts of 10-120 words, generated offline from the tokenizer's vocabulary.

No downloads, and the same texts for every system: lengths vary so batching has
to pad (dynamic padding), and the seed makes two runs send identical requests.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

MIN_WORDS, MAX_WORDS = 10, 120
SEED = 1234


def word_list(tokenizer_dir: Path) -> list[str]:
    """Whole alphabetic words of the WordPiece vocabulary (no ``##`` pieces, no special tokens)."""
    words = []
    for line in (tokenizer_dir / "vocab.txt").read_text(encoding="utf-8").splitlines():
        if line.isascii() and line.isalpha() and len(line) > 1:
            words.append(line)
    return words


def make_corpus(words: list[str], size: int, seed: int = SEED, min_words: int = MIN_WORDS,
                max_words: int = MAX_WORDS) -> list[str]:
    """``size`` sentences-ish texts; word counts uniform in [min_words, max_words]."""
    rng = random.Random(seed)
    texts = []
    for _ in range(size):
        count = rng.randint(min_words, max_words)
        picked = rng.choices(words, k=count)
        text = " ".join(picked)
        texts.append(text[0].upper() + text[1:] + ".")
    return texts


def builtin_words(count: int = 2000, seed: int = SEED) -> list[str]:
    """Pronounceable lowercase words for a workload without a tokenizer (W0), fixed by the seed."""
    rng = random.Random(seed)
    consonants, vowels = "bcdfghklmnprstvz", "aeiou"
    return ["".join(rng.choice(consonants) + rng.choice(vowels) for _ in range(rng.randint(1, 4)))
            for _ in range(count)]


def write_corpus(tokenizer_dir: Path | None, size: int, path: Path) -> list[str]:
    """Build the corpus and store it as JSON for the load generator process."""
    texts = make_corpus(word_list(tokenizer_dir) if tokenizer_dir is not None else builtin_words(), size)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(texts))
    return texts


def read_corpus(path: Path) -> list[str]:
    return json.loads(Path(path).read_text())

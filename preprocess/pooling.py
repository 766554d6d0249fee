"""Pooling: an encoder's token vectors (``last_hidden_state``, ``[rows, positions, hidden]``) to one
vector a text, with the attention mask saying which positions are real.

Plug-ins by name (``POOLINGS``): adding a way to pool is one function and one entry, never another
``if``. Each computes what sentence-transformers' ``Pooling`` module computes for its mode (the
``1_Pooling/config.json`` a model folder carries names it), so an endpoint answers the vectors
``SentenceTransformer.encode`` gives. Sums run in float64 and the result is float32: the model's own
float32 rounding then dominates any difference (docs/embeddings.md, "Correctness").

Rows are right-padded (the worker's tokenizer and batcher pad on the right), but nothing here
assumes it: ``cls`` takes each row's first real position and ``last`` its last, as
sentence-transformers does for either side.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

Pooling = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``(hidden [rows, positions, dim], mask [rows, positions]) -> [rows, dim]`` float32."""


def _mask(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return (np.asarray(mask) != 0)[:, : hidden.shape[1]]


def mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The average of the real positions' vectors."""
    real = _mask(hidden, mask)
    total = np.einsum("rpd,rp->rd", hidden.astype(np.float64), real.astype(np.float64))
    return (total / np.maximum(real.sum(axis=1, keepdims=True), 1e-9)).astype(np.float32)


def mean_sqrt_len(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The sum of the real positions' vectors over the square root of their count."""
    real = _mask(hidden, mask)
    total = np.einsum("rpd,rp->rd", hidden.astype(np.float64), real.astype(np.float64))
    return (total / np.sqrt(np.maximum(real.sum(axis=1, keepdims=True), 1e-9))).astype(np.float32)


def cls(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The first real position's vector (BERT's [CLS] token)."""
    first = np.argmax(_mask(hidden, mask), axis=1)
    return np.ascontiguousarray(hidden[np.arange(hidden.shape[0]), first], dtype=np.float32)


def last(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The last real position's vector (decoder embedders: the end-of-text token)."""
    real = _mask(hidden, mask)
    width = real.shape[1]
    index = width - 1 - np.argmax(real[:, ::-1], axis=1)
    return np.ascontiguousarray(hidden[np.arange(hidden.shape[0]), index], dtype=np.float32)


def max_(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Each dimension's largest value over the real positions."""
    real = _mask(hidden, mask)
    return np.where(real[:, :, None], hidden, -np.inf).max(axis=1).astype(np.float32)


def weighted_mean(hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Positions weighted 1, 2, 3, ... from the first real one (GPT-style embedders)."""
    real = _mask(hidden, mask)
    start = np.argmax(real, axis=1)[:, None]
    weights = (np.arange(1, real.shape[1] + 1)[None, :] - start) * real
    total = np.einsum("rpd,rp->rd", hidden.astype(np.float64), weights.astype(np.float64))
    return (total / np.maximum(weights.sum(axis=1, keepdims=True), 1e-9)).astype(np.float32)


POOLINGS: dict[str, Pooling] = {
    "mean": mean,
    "cls": cls,
    "max": max_,
    "last": last,
    "mean_sqrt_len": mean_sqrt_len,
    "weighted_mean": weighted_mean,
}

# sentence-transformers' and TEI's names for the same modes
ALIASES = {"lasttoken": "last", "last-token": "last", "last_token": "last", "mean_sqrt_len_tokens": "mean_sqrt_len",
           "weightedmean": "weighted_mean", "mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}


def pooling_name(name: str) -> str:
    """The canonical name of a pooling mode (ours, sentence-transformers' or TEI's); ValueError naming
    the modes there are."""
    key = ALIASES.get(str(name).strip().lower(), str(name).strip().lower())
    if key not in POOLINGS:
        raise ValueError(f"unknown pooling {name!r}; one of {', '.join(POOLINGS)}")
    return key


def pool(name: str, hidden: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return POOLINGS[pooling_name(name)](hidden, mask)


def normalize(vectors: np.ndarray) -> np.ndarray:
    """Each row to unit length (L2), as sentence-transformers' ``Normalize`` does (a zero row stays zero)."""
    v = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(v.astype(np.float64), axis=-1, keepdims=True)
    return (v / np.maximum(norms, 1e-12)).astype(np.float32)

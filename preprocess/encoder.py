"""Encoder endpoints: a tokenizer in, sentence embeddings or cross-encoder scores out.

A tokenizer endpoint with ``task`` ``embed`` or ``rerank`` in its options (``serving model add
--pooling ...``, ``--task rerank``, or read from a sentence-transformers folder:
preprocess/sentence_folder.py). Requests are the data plane's own, so every front end (``/serve``,
OpenAI's ``/embeddings``, TEI's routes) gets routing, keys, statistics and shadows the same way:

- embed: ``{"text": str}``, ``{"texts": [str, ...]}`` or ``{"input_ids": [[int, ...], ...]}``
  (token ids as they are, no special tokens added), with optional ``normalize`` (default: the
  endpoint's), ``dimensions`` (the first N, renormalized, as Matryoshka models are used) and
  ``truncate`` (default true; false: a text past the model's length is a 413);
- rerank: ``{"query": str, "texts": [str, ...]}``, optional ``raw_scores`` (the logit, not its sigmoid).

The model's output is pooled per engine call (:meth:`EncoderProcessor.reduce`, which the data plane
calls on each batch its token batcher forms: serving/embeddings/token_batcher.py), so a batch's
positions never travel further than the pooling; ``postprocess`` normalizes, truncates and answers
numpy arrays the front ends write in their own formats.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from preprocess.base import Collect, InputTooLarge, PreprocessError
from preprocess.pooling import POOLINGS, normalize, pooling_name
from preprocess.sentence_folder import ACTIVATIONS, EMBED, RERANK, TASKS
from preprocess.tokenizer import DEFAULT_MAX_LENGTH, load_tokenizer

MAX_CLIENT_BATCH = 2048  # texts one request may carry (OpenAI's limit); past it a 413
MAX_BATCH_TOKENS = 16384  # padded tokens of one engine call (TEI's --max-batch-tokens default)
EMBED_OUTPUTS = ("last_hidden_state", "token_embeddings", "sentence_embedding")


def is_encoder(options: dict[str, Any]) -> bool:
    return (options or {}).get("task") in TASKS


def check_options(options: dict[str, Any]) -> None:
    """An encoder endpoint's options as the control plane takes them (ValueError naming the bad one), so
    a wrong pooling is a 422 at ``model add``, not a load failure on every worker."""
    task = options.get("task")
    if task is None:
        return
    if task not in TASKS:
        raise ValueError(f"task {task!r} is not one of {', '.join(TASKS)}")
    if options.get("pooling") is not None:
        pooling_name(options["pooling"])
    if options.get("activation") is not None and options["activation"] not in ACTIVATIONS:
        raise ValueError(f"activation {options['activation']!r} is not one of {', '.join(ACTIVATIONS)}")
    for name in ("max_length", "max_batch_tokens", "max_client_batch"):
        value = options.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")


@dataclass
class EncoderRequest:
    texts: list[str] | None = None
    pairs: list[str] | None = None        # rerank: each text paired with the query
    ids: list[list[int]] | None = None    # token ids as sent
    single: bool = False
    truncate: bool = True
    normalize: bool | None = None
    dimensions: int | None = None
    raw_scores: bool = False

    @property
    def count(self) -> int:
        return len(self.ids if self.ids is not None else self.texts or ())


def _strings(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not value:
        raise PreprocessError(f'"{name}" must be a non-empty list of strings')
    bad = next((i for i, t in enumerate(value) if not isinstance(t, str)), None)
    if bad is not None:
        raise PreprocessError(f'"{name}" items must be strings; item {bad} is not')
    return value


def _token_rows(value: Any) -> list[list[int]]:
    rows = value if isinstance(value, list) and value and isinstance(value[0], list) else [value]
    if not rows or not all(isinstance(r, list) and r for r in rows):
        raise PreprocessError('"input_ids" must be a non-empty list of token ids, or a list of such lists')
    for i, row in enumerate(rows):
        if not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in row):
            raise PreprocessError(f'"input_ids" row {i} holds something other than non-negative integers')
    return rows


def _flag(body: dict[str, Any], name: str, default: Any) -> Any:
    value = body.get(name, default)
    if value is not None and not isinstance(value, bool):
        raise PreprocessError(f'"{name}" must be true or false')
    return value


def parse_request(body: Any, task: str) -> EncoderRequest:
    if not isinstance(body, dict):
        raise PreprocessError('the body must be a JSON object: {"text": ...}, {"texts": [...]}'
                              + (' or {"query": ..., "texts": [...]}' if task == RERANK else ""))
    dimensions = body.get("dimensions")
    if dimensions is not None and (not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1):
        raise PreprocessError('"dimensions" must be a positive integer')
    request = EncoderRequest(truncate=_flag(body, "truncate", True), normalize=_flag(body, "normalize", None),
                             dimensions=dimensions, raw_scores=bool(_flag(body, "raw_scores", False)))
    if task == RERANK:
        query = body.get("query")
        if not isinstance(query, str):
            raise PreprocessError('a cross-encoder endpoint takes {"query": "...", "texts": ["...", ...]}')
        request.pairs = _strings(body.get("texts"), "texts")
        request.texts = [query] * len(request.pairs)
    elif "text" in body:
        if not isinstance(body["text"], str):
            raise PreprocessError(f'"text" must be a string, got {type(body["text"]).__name__}')
        request.texts, request.single = [body["text"]], True
    elif "texts" in body:
        request.texts = _strings(body["texts"], "texts")
    elif "input_ids" in body:
        request.ids = _token_rows(body["input_ids"])
    else:
        raise PreprocessError('missing field "text" (a string), "texts" (a list of strings) or "input_ids"')
    return request


class EncoderProcessor:
    """Texts -> token tensors; the encoder's output -> one vector a text (embed) or a score a pair (rerank)."""

    outputs_form = "dict"
    has_process = False

    def __init__(self, directory: Path, task: str = EMBED, pooling: str = "mean", normalize: bool = False,
                 max_length: int = DEFAULT_MAX_LENGTH, activation: str = "sigmoid", lowercase: bool = False,
                 output: str | None = None, max_client_batch: int = MAX_CLIENT_BATCH,
                 max_batch_tokens: int = MAX_BATCH_TOKENS) -> None:
        if task not in TASKS:
            raise ValueError(f"unknown encoder task {task!r}; one of {', '.join(TASKS)}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}; one of {', '.join(ACTIVATIONS)}")
        self.task, self.pooling, self.normalize = task, pooling_name(pooling), bool(normalize)
        self.max_length, self.activation, self.lowercase = int(max_length), activation, bool(lowercase)
        self.output, self.max_client_batch = output, int(max_client_batch)
        self.max_batch_tokens = int(max_batch_tokens)
        self.tokenizer = load_tokenizer(directory, self.max_length)
        self.pad_values = {"input_ids": self.tokenizer.pad_id, "attention_mask": 0, "token_type_ids": 0}
        self._pool = POOLINGS[self.pooling]

    @classmethod
    def from_options(cls, directory: Path, options: dict[str, Any]) -> "EncoderProcessor":
        return cls(directory, task=options["task"], pooling=options.get("pooling") or "mean",
                   normalize=bool(options.get("normalize")),
                   max_length=int(options.get("max_length") or DEFAULT_MAX_LENGTH),
                   activation=options.get("activation") or "sigmoid", lowercase=bool(options.get("lowercase")),
                   output=options.get("output"),
                   max_client_batch=int(options.get("max_client_batch") or MAX_CLIENT_BATCH),
                   max_batch_tokens=int(options.get("max_batch_tokens") or MAX_BATCH_TOKENS))

    # --- request -> tensors ------------------------------------------------------------
    def read(self, body: Any) -> EncoderRequest:
        request = parse_request(body, self.task)
        if request.count > self.max_client_batch:
            raise InputTooLarge(f"batch size {request.count} > maximum allowed batch size {self.max_client_batch}")
        return request

    def tensors(self, request: EncoderRequest) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Right-padded token tensors and each row's real length."""
        if request.ids is not None:
            return self._id_tensors(request)
        texts = [t.lower() for t in request.texts] if self.lowercase else request.texts
        pairs = [t.lower() for t in request.pairs] if self.lowercase and request.pairs else request.pairs
        tensors, truncated = self.tokenizer.encode(texts, pairs)
        if not request.truncate and any(truncated):
            first = truncated.index(True)
            raise InputTooLarge(f"input {first} is longer than the model's {self.max_length} tokens; send "
                                "shorter text or ask for truncation (truncate: true)")
        return tensors, tensors["attention_mask"].sum(axis=1)

    def _id_tensors(self, request: EncoderRequest) -> tuple[dict[str, np.ndarray], np.ndarray]:
        rows = request.ids or []
        longest = max(len(r) for r in rows)
        if longest > self.max_length and not request.truncate:
            first = next(i for i, r in enumerate(rows) if len(r) > self.max_length)
            raise InputTooLarge(f"input {first} has {len(rows[first])} tokens; the model takes at most "
                                f"{self.max_length}")
        width = min(longest, self.max_length)
        ids = np.full((len(rows), width), self.tokenizer.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            row = row[:width]
            ids[i, :len(row)] = row
            mask[i, :len(row)] = 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}, mask.sum(axis=1)

    async def preprocess(self, body: Any, state: dict, collect: Collect) -> dict[str, np.ndarray]:
        request = self.read(body)
        tensors, lengths = self.tensors(request)
        tokens = [int(n) for n in lengths]
        state.update(request=request, tokens=tokens)
        collect({"tokens": sum(tokens), "inputs": len(tokens)})
        return tensors

    def usage(self, state: dict) -> dict[str, Any]:
        """A request's counts for its statistics event and its client key's token budget."""
        return {"task": self.task, "inputs": len(state["tokens"]), "tokens": sum(state["tokens"])}

    async def process(self, data: Any, state: dict, collect: Collect) -> Any:
        raise PreprocessError("an encoder endpoint needs a model engine (triton or onnxruntime)")

    # --- one engine call's outputs -> a row each ------------------------------------------
    def _output(self, outputs: dict[str, np.ndarray], preferred: tuple[str, ...]) -> np.ndarray:
        for name in ((self.output,) if self.output else ()) + preferred:
            if name in outputs:
                return np.asarray(outputs[name])
        return np.asarray(next(iter(outputs.values())))

    def reduce(self, outputs: dict[str, np.ndarray], lengths: np.ndarray) -> dict[str, np.ndarray]:
        """Each row's vector (pooled over its real positions) or score: what one engine call gave,
        row by row, so that rows of many requests may share a call (serving/embeddings/token_batcher.py)."""
        if self.task == RERANK:
            logits = self._output(outputs, ("logits",))
            logits = logits.reshape(logits.shape[0], -1)
            if logits.shape[1] != 1:
                raise PreprocessError(f"a cross-encoder gives one logit a pair; this model gives {logits.shape[1]} "
                                      "(deploy it as a classifier, without --task rerank)")
            return {"logits": logits[:, 0].astype(np.float32)}
        hidden = self._output(outputs, EMBED_OUTPUTS)
        if hidden.ndim == 2:  # the model pools itself (a whole pipeline exported)
            return {"embedding": hidden.astype(np.float32, copy=False)}
        if hidden.ndim != 3:
            raise PreprocessError(f"the model's output has shape {list(hidden.shape)}; an embedding endpoint "
                                  "needs [texts, positions, dim] to pool, or [texts, dim]")
        mask = np.arange(hidden.shape[1])[None, :] < np.asarray(lengths)[:, None]
        return {"embedding": self._pool(hidden, mask)}

    # --- rows -> answer -------------------------------------------------------------------
    async def postprocess(self, data: dict[str, np.ndarray], state: dict, collect: Collect) -> dict[str, Any]:
        request: EncoderRequest = state["request"]
        tokens = state["tokens"]
        if self.task == RERANK:
            logits = np.asarray(data["logits"], dtype=np.float32)
            scores = logits if request.raw_scores or self.activation == "identity" else _sigmoid(logits)
            return {"scores": scores, "tokens": tokens}
        vectors = np.asarray(data["embedding"], dtype=np.float32)
        if request.normalize if request.normalize is not None else self.normalize:
            vectors = normalize(vectors)
        if request.dimensions is not None:
            if request.dimensions > vectors.shape[1]:
                raise PreprocessError(f'"dimensions" is {request.dimensions}; this model\'s embeddings have '
                                      f"{vectors.shape[1]}")
            vectors = normalize(vectors[:, :request.dimensions])
        if request.single:
            return {"embedding": vectors[0], "tokens": tokens[0]}
        return {"embeddings": vectors, "tokens": tokens}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)

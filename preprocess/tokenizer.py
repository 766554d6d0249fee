"""Built-in text preprocessing: a Hugging Face fast tokenizer in, labels and scores out.

It uses the ``tokenizers`` library directly on ``tokenizer.json`` (the same Rust
tokenizer ``transformers`` wraps) because importing ``transformers`` costs seconds
and memory in every worker process; a directory without ``tokenizer.json`` falls
back to ``transformers.AutoTokenizer``. Padding is dynamic: to the longest text of
the request, never to ``max_length``, which is what keeps short requests cheap;
optionally rounded up to a multiple of ``pad_to_multiple_of``, because Triton's
dynamic batcher only batches requests whose tensors have the same shape: a few
length buckets let concurrent requests of different lengths share one batch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from preprocess.base import Collect, PreprocessError

DEFAULT_MAX_LENGTH = 128
MAX_TEXTS = 256  # per request; a bigger batch belongs in several requests


def read_texts(body: Any) -> tuple[list[str], bool]:
    """The texts of ``{"text": str}`` or ``{"texts": [str, ...]}``, and whether it was one."""
    if not isinstance(body, dict):
        raise PreprocessError('the body must be a JSON object: {"text": "..."} or {"texts": ["...", ...]}')
    if "text" in body:
        text = body["text"]
        if not isinstance(text, str):
            raise PreprocessError(f'"text" must be a string, got {type(text).__name__}')
        return [text], True
    if "texts" in body:
        texts = body["texts"]
        if not isinstance(texts, list) or not texts:
            raise PreprocessError('"texts" must be a non-empty list of strings')
        if len(texts) > MAX_TEXTS:
            raise PreprocessError(f'"texts" has {len(texts)} items; at most {MAX_TEXTS} per request')
        bad = [i for i, t in enumerate(texts) if not isinstance(t, str)]
        if bad:
            raise PreprocessError(f'"texts" items must be strings; item {bad[0]} is not')
        return texts, False
    raise PreprocessError('missing field "text" (a string) or "texts" (a list of strings)')


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


class _RustTokenizer:
    def __init__(self, directory: Path, max_length: int, multiple: int | None) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
        config = _read_json(directory / "tokenizer_config.json")
        pad = config.get("pad_token") or "[PAD]"
        pad = pad.get("content", "[PAD]") if isinstance(pad, dict) else pad
        pad_id = self.tok.token_to_id(pad)
        self.pad_id = pad_id if pad_id is not None else 0
        self.max_length = max_length
        self.tok.enable_truncation(max_length)
        self.tok.enable_padding(pad_id=self.pad_id, pad_token=pad, pad_to_multiple_of=multiple)

    def _encodings(self, texts: list[str], pairs: list[str] | None) -> list[Any]:
        # encode_batch hands even one text to a thread pool; a single text is ~25% cheaper inline
        if len(texts) == 1:
            return [self.tok.encode(texts[0], pairs[0] if pairs else None)]
        return self.tok.encode_batch(texts if pairs is None else list(zip(texts, pairs)))

    @staticmethod
    def _tensors(encs: list[Any]) -> dict[str, np.ndarray]:
        return {
            "input_ids": np.array([e.ids for e in encs], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64),
        }

    def __call__(self, texts: list[str]) -> dict[str, np.ndarray]:
        return self._tensors(self._encodings(texts, None))

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> tuple[dict[str, np.ndarray], list[bool]]:
        """Tensors of texts (or of text pairs: [CLS] a [SEP] b [SEP]), and which were truncated."""
        encs = self._encodings(texts, pairs)
        return self._tensors(encs), [bool(e.overflowing) for e in encs]

    def tokens(self, text: str, special: bool) -> list[tuple[int, str, bool, tuple[int, int]]]:
        """(id, token, is special, character span) of each token of ``text``, untruncated (the event
        loop's thread is the only one that tokenizes, so switching truncation off and on is safe)."""
        self.tok.no_truncation()
        try:
            enc = self.tok.encode(text, add_special_tokens=special)
        finally:
            self.tok.enable_truncation(self.max_length)
        return [(i, t, bool(s), o) for i, t, s, o in zip(enc.ids, enc.tokens, enc.special_tokens_mask, enc.offsets)]


class _HfTokenizer:
    def __init__(self, directory: Path, max_length: int, multiple: int | None) -> None:
        from transformers import AutoTokenizer

        self.tok = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
        self.max_length, self.multiple = max_length, multiple
        self.pad_id = self.tok.pad_token_id or 0

    def __call__(self, texts: list[str], pairs: list[str] | None = None) -> dict[str, np.ndarray]:
        enc = self.tok(texts, pairs, truncation=True, max_length=self.max_length, padding=True,
                       pad_to_multiple_of=self.multiple, return_tensors="np")
        return {k: np.asarray(v, dtype=np.int64) for k, v in enc.items()}

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> tuple[dict[str, np.ndarray], list[bool]]:
        full = self.tok(texts, pairs, truncation=False)["input_ids"]
        return self(texts, pairs), [len(ids) > self.max_length for ids in full]

    def tokens(self, text: str, special: bool) -> list[tuple[int, str, bool, tuple[int, int]]]:
        enc = self.tok(text, add_special_tokens=special, return_offsets_mapping=True,
                       return_special_tokens_mask=True)
        ids = enc["input_ids"]
        return [(i, t, bool(s), tuple(o)) for i, t, s, o in zip(ids, self.tok.convert_ids_to_tokens(ids),
                                                                   enc["special_tokens_mask"], enc["offset_mapping"])]


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def load_tokenizer(directory: Path, max_length: int, multiple: int | None = None) -> Any:
    """The folder's fast tokenizer (``tokenizer.json``) with the ``tokenizers`` library, else transformers'."""
    kind = _RustTokenizer if (directory / "tokenizer.json").exists() else _HfTokenizer
    return kind(directory, max_length, multiple)


class TokenizerProcessor:
    """``{"text"}``/``{"texts"}`` -> token tensors; logits -> label, score, logits.

    Reports the custom statistics ``tokens`` (tokens of the first text), ``label``
    and ``score`` (its prediction), so drift on input length and on predicted
    class works without any user code.
    """

    outputs_form = "dict"
    has_process = False

    def __init__(self, directory: Path, max_length: int = DEFAULT_MAX_LENGTH,
                 labels: list[str] | None = None, output: str | None = None, pad_to_multiple_of: int = 0) -> None:
        if pad_to_multiple_of and max_length % pad_to_multiple_of:
            raise ValueError(f"max_length {max_length} is not a multiple of pad_to_multiple_of {pad_to_multiple_of}")
        self.encode = load_tokenizer(directory, max_length, pad_to_multiple_of or None)
        self.labels = labels or []
        self.output = output
        # What pads each tensor, so an engine may batch requests of different lengths together:
        # padded positions carry mask 0, which BERT-like models ignore.
        self.pad_values = {"input_ids": self.encode.pad_id, "attention_mask": 0, "token_type_ids": 0}

    @classmethod
    def from_options(cls, directory: Path, options: dict[str, Any]) -> "TokenizerProcessor":
        return cls(directory, int(options.get("max_length") or DEFAULT_MAX_LENGTH), options.get("labels"),
                   options.get("output"), int(options.get("pad_to_multiple_of") or 0))

    async def preprocess(self, body: Any, state: dict, collect: Collect) -> dict[str, np.ndarray]:
        texts, single = read_texts(body)
        tensors = self.encode(texts)
        state["single"] = single
        collect({"tokens": int(tensors["attention_mask"][0].sum())})
        return tensors

    async def process(self, data: Any, state: dict, collect: Collect) -> Any:
        raise PreprocessError("the tokenizer preprocessor needs a model engine (triton or onnxruntime)")

    async def postprocess(self, data: dict[str, np.ndarray], state: dict, collect: Collect) -> dict[str, Any]:
        raw = np.asarray(data[self.output] if self.output in data else next(iter(data.values())))
        raw = raw.reshape(raw.shape[0], -1)
        probs = softmax(raw.astype(np.float64))
        answers = [{"label": self._label(int(k)), "score": float(p[k]), "logits": row.tolist()}
                   for k, p, row in zip(probs.argmax(axis=-1), probs, raw)]
        collect({"label": answers[0]["label"], "score": answers[0]["score"]})
        return answers[0] if state.get("single") else {"predictions": answers}

    def _label(self, index: int) -> str:
        return self.labels[index] if index < len(self.labels) else f"LABEL_{index}"

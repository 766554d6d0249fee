"""W1/W2(/W3): the models under test, built once into benchmarks' own cache.

Every system must serve the *same weights*: the ONNX file for Triton, the
platform and the ceiling, and the torch model it was exported from (saved with
``save_pretrained``) for the FastAPI + transformers baseline.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from serving.testmodels import ModelBundle, build_bert_classifier, build_minilm_classifier, load_torch_model

CACHE_DIR = Path(__file__).resolve().parent / ".cache"
MAX_LENGTH = 128  # truncation length, the same for every system


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    build: Callable[[Path], ModelBundle] | None  # None: no model (W0)


@dataclass(frozen=True)
class PreparedWorkload:
    """Files every system loads: ONNX + tokenizer, and the Hugging Face copy of the torch model."""

    workload: Workload
    dir: Path
    onnx_path: Path | None
    tokenizer_dir: Path | None  # None: the corpus draws from a built-in word list (W0)
    hf_dir: Path | None
    labels: list[str]


WORKLOADS: dict[str, Workload] = {
    "W0": Workload("W0", "no model: every system echoes its input, so only the serving path is measured", None),
    "W1": Workload("W1", "tiny BERT classifier (2 layers, hidden 128): the serving path dominates",
                   lambda d: build_bert_classifier(d, num_layers=2, hidden_size=128)),
    "W2": Workload("W2", "MiniLM-L6 classifier (all-MiniLM-L6-v2 encoder + head): realistic",
                   build_minilm_classifier),
    "W3": Workload("W3", "bert-base-sized classifier (12 layers, hidden 768, random weights): for GPUs",
                   lambda d: build_bert_classifier(d, num_layers=12, hidden_size=768, num_heads=12,
                                                   intermediate_size=3072)),
}
NO_MODEL = frozenset(name for name, w in WORKLOADS.items() if w.build is None)


def prepare(name: str, cache_dir: Path = CACHE_DIR) -> PreparedWorkload:
    """Build (or reuse) the ONNX bundle and save its torch model next to it."""
    workload = WORKLOADS[name]
    out = cache_dir / name
    if workload.build is None:
        return PreparedWorkload(workload, out, None, None, None, [])
    bundle = workload.build(out)
    hf_dir = out / "hf"
    if not (hf_dir / "config.json").exists():
        save_hf_copy(out, bundle, hf_dir)
    return PreparedWorkload(workload, out, bundle.onnx_path, bundle.tokenizer_dir, hf_dir, bundle.labels)


def save_hf_copy(bundle_dir: Path, bundle: ModelBundle, hf_dir: Path) -> None:
    """The exact torch model the ONNX came from, with the labels and tokenizer a pipeline needs."""
    import shutil

    model = load_torch_model(bundle_dir)
    model.config.id2label = dict(enumerate(bundle.labels))
    model.config.label2id = {label: i for i, label in enumerate(bundle.labels)}
    tmp = hf_dir.with_name("hf.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for item in bundle.tokenizer_dir.iterdir():
        shutil.copyfile(item, tmp / item.name)
    (tmp / "labels.json").write_text(json.dumps(bundle.labels))
    shutil.rmtree(hf_dir, ignore_errors=True)
    tmp.replace(hf_dir)

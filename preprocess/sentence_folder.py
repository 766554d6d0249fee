"""What a sentence-transformers model folder, as users have it, says about serving it.

A ``SentenceTransformer`` folder lists its modules in ``modules.json``: the transformer, then
``Pooling`` (its mode in ``1_Pooling/config.json``) and often ``Normalize``. A ``CrossEncoder`` folder
is a sequence classifier with one label, and its score activation (sigmoid by default). Both formats
are read: the one sentence-transformers 2.x-5.x writes (``pooling_mode_mean_tokens: true``...) and
6.x's (``pooling_mode: "mean"``). Only files are read, never the library: the CLI reads the folder
when an endpoint is deployed with ``--tokenizer FOLDER`` and turns it into the endpoint's options.

A module the worker does not run (``Dense``, ``LayerNorm``, ...) is refused with what to do instead:
a model whose whole pipeline is exported to ONNX (its output already one vector a text) needs none.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from preprocess.pooling import pooling_name

EMBED, RERANK = "embed", "rerank"
TASKS = (EMBED, RERANK)
ACTIVATIONS = ("sigmoid", "identity")  # a cross-encoder's score: sigmoid(logit) or the logit
_LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                 "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
                 "pooling_mode_weightedmean_tokens": "weighted_mean", "pooling_mode_lasttoken": "last"}
_HARMLESS = ("Dropout",)  # modules that do nothing at inference
LONGEST = 100_000  # a tokenizer_config model_max_length above this is transformers' "no limit" placeholder


class FolderError(ValueError):
    """The folder describes a model the worker cannot serve as it is; the message says what to do."""


@dataclass(frozen=True)
class EncoderSpec:
    """An encoder endpoint's options (the snapshot's ``preprocess.options``)."""

    task: str
    pooling: str | None = None
    normalize: bool = False
    max_length: int | None = None
    activation: str | None = None
    lowercase: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)

    def options(self) -> dict[str, Any]:
        out: dict[str, Any] = {"task": self.task}
        if self.task == EMBED:
            out |= {"pooling": self.pooling or "mean", "normalize": self.normalize}
        else:
            out["activation"] = self.activation or "sigmoid"
        if self.max_length:
            out["max_length"] = self.max_length
        if self.lowercase:
            out["lowercase"] = True
        return out


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _kind(module_type: str) -> str:
    """``sentence_transformers.models.Pooling`` and 6.x's ``...modules.pooling.Pooling`` -> ``Pooling``."""
    return str(module_type).rsplit(".", 1)[-1]


def read_pooling(config: dict[str, Any]) -> str:
    """The mode of a ``1_Pooling/config.json``, in either format; one mode only."""
    mode = config.get("pooling_mode")
    if mode is None:
        modes = [name for key, name in _LEGACY_MODES.items() if config.get(key)]
        mode = modes or ["mean"]  # sentence-transformers' own default
    modes = [mode] if isinstance(mode, str) else list(mode)
    if len(modes) != 1:
        raise FolderError(f"1_Pooling/config.json combines several pooling modes {modes}; the worker pools with "
                          "one: export the whole pipeline to ONNX (its output one vector a text) instead")
    try:
        return pooling_name(modes[0])
    except ValueError as exc:
        raise FolderError(f"1_Pooling/config.json: {exc}") from None


def max_length(folder: Path) -> int | None:
    """What sentence-transformers truncates at: ``max_seq_length``, else the tokenizer's
    ``model_max_length``, never past the model's position table."""
    st = _json(folder / "sentence_bert_config.json") or {}
    tok = _json(folder / "tokenizer_config.json") or {}
    model = _json(folder / "config.json") or {}
    positions = model.get("max_position_embeddings")
    for value in (st.get("max_seq_length"), tok.get("model_max_length")):
        if isinstance(value, int) and 0 < value < LONGEST:
            return min(value, positions) if isinstance(positions, int) and positions > 0 else value
    return positions if isinstance(positions, int) and positions > 0 else None


def _activation(folder: Path, model: dict[str, Any]) -> str:
    path = ((_json(folder / "config_sentence_transformers.json") or {}).get("activation_fn")
            or (model.get("sentence_transformers") or {}).get("activation_fn")
            or model.get("sbert_ce_default_activation_function") or "torch.nn.modules.activation.Sigmoid")
    name = str(path).rsplit(".", 1)[-1].lower()
    if name not in ACTIVATIONS:
        raise FolderError(f"the cross-encoder's activation {path!r} is not one the worker applies "
                          f"({', '.join(ACTIVATIONS)})")
    return name


def _is_cross_encoder(folder: Path, model: dict[str, Any]) -> bool:
    st_model = (_json(folder / "config_sentence_transformers.json") or {}).get("model_type")
    task = (_json(folder / "sentence_bert_config.json") or {}).get("transformer_task")
    if st_model == "CrossEncoder" or task == "sequence-classification":
        return True
    archs = model.get("architectures") or []
    labels = model.get("id2label") or {}
    return (any(str(a).endswith("ForSequenceClassification") for a in archs) and len(labels) == 1
            and ("sentence_transformers" in model or "sbert_ce_default_activation_function" in model))


def read_folder(folder: Path) -> EncoderSpec | None:
    """The encoder options a sentence-transformers folder implies; None when it is not one."""
    folder = Path(folder)
    model = _json(folder / "config.json") or {}
    modules = _json(folder / "modules.json")
    lowercase = bool((_json(folder / "sentence_bert_config.json") or {}).get("do_lower_case"))
    if _is_cross_encoder(folder, model):
        return EncoderSpec(RERANK, activation=_activation(folder, model), max_length=max_length(folder),
                           lowercase=lowercase)
    if not isinstance(modules, list):
        return None
    pooling, normalize = None, False
    for module in modules:
        kind = _kind((module or {}).get("type", ""))
        if kind == "Transformer" or kind in _HARMLESS:
            continue
        if kind == "Pooling":
            pooling = read_pooling(_json(folder / str(module.get("path") or "1_Pooling") / "config.json") or {})
        elif kind == "Normalize":
            normalize = True
        else:
            raise FolderError(f"modules.json has a {kind} module, which the worker does not run (it pools and "
                              "normalizes only): export the whole pipeline to ONNX so that its output is the "
                              "sentence embedding (a 2-D output is used as it is), and deploy that with --task embed")
    if pooling is None:
        return None
    return EncoderSpec(EMBED, pooling=pooling, normalize=normalize, max_length=max_length(folder),
                       lowercase=lowercase)

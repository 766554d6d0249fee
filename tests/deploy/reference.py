"""What a served classifier must answer: onnxruntime run here, on the same input, from the endpoint's
tokenizer. Shared by the compose test and the Kubernetes test."""
from __future__ import annotations

import numpy as np

TEXT = "the service was quick and the staff were friendly"


def encode(bundle, texts: list[str]) -> dict[str, np.ndarray]:
    """The model's inputs for ``texts``, from the endpoint's tokenizer."""
    import onnxruntime as ort
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="np")
    names = [i.name for i in ort.InferenceSession(str(bundle.onnx_path)).get_inputs()]
    return {name: enc[name].astype(np.int64) for name in names}


def reference_logits(bundle, texts: list[str]) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(bundle.onnx_path), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], encode(bundle, texts))[0]

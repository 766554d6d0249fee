"""The ``model.py`` of triton-tokenizer: tokenizer and onnxruntime inside Triton's Python backend.

Copied into the model repository by benchmarks/systems/triton_tokenizer.py, run by Triton's
``triton_python_backend_stub`` exactly as the platform's embedded Triton runs its models
(serving/triton/backend_model.py), so the comparison is like for like. ``execute`` decodes
every text of the batch Triton formed, tokenizes them together (padding to the longest), runs
once and splits the logits back per request. The session is serving/ort.py's, as in the
platform's models: onnxruntime's spinning intra-op threads halved this model's throughput inside
the backend stub (W2, one client: 28.5 req/s spinning, 55.1 without).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        import os

        from benchmarks.systems.ort_session import tokenizer
        from serving.ort import session

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in (config.get("parameters") or {}).items()}
        self.sess = session(Path(params["onnx"]), os.cpu_count() or 1)
        self.tok = tokenizer(Path(params["tokenizer"]))
        self.wanted = {i.name for i in self.sess.get_inputs()}
        self.max_length = int(params["max_length"])

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb

        per_request = [pb.get_input_tensor_by_name(r, "text").as_numpy().reshape(-1) for r in requests]
        texts = [t.decode("utf-8") for arr in per_request for t in arr]
        enc = self.tok(texts, padding="longest", truncation=True, max_length=self.max_length, return_tensors="np")
        (logits,) = self.sess.run(["logits"], {k: v.astype(np.int64) for k, v in enc.items() if k in self.wanted})
        logits = logits.astype(np.float32)
        parts = np.split(logits, np.cumsum([len(a) for a in per_request])[:-1])
        return [pb.InferenceResponse(output_tensors=[pb.Tensor("logits", np.ascontiguousarray(p))]) for p in parts]

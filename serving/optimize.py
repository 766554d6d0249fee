"""Optional model optimization at registration: onnxruntime's transformer fusions, int8 quantization,
fp16 (for GPU workers).

An optimized model is only worth shipping if it still predicts what the original
predicted, so every optimization is reported with its label agreement (and the
largest logit difference) on a seeded sample of token batches.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort


@dataclass
class OptimizationReport:
    mode: str
    path: Path
    samples: int
    label_agreement: float
    max_abs_logit_diff: float
    size_before: int
    size_after: int

    def as_metadata(self) -> dict:
        return {"optimize": self.mode, "label_agreement": self.label_agreement,
                "max_abs_logit_diff": self.max_abs_logit_diff, "agreement_samples": self.samples}


def fuse(src: Path, dest: Path, num_heads: int = 0, hidden_size: int = 0) -> Path:
    """Attention/LayerNorm/GELU fusions for BERT-like encoders. Attention fusion needs the
    head count and width; 0 lets onnxruntime try to detect them from the graph."""
    from onnxruntime.transformers.optimizer import optimize_model

    optimize_model(str(src), model_type="bert", num_heads=num_heads, hidden_size=hidden_size, opt_level=1,
                   use_gpu=False).save_model_to_file(str(dest))
    return dest


def quantize_int8(src: Path, dest: Path, num_heads: int = 0, hidden_size: int = 0) -> Path:
    """Fuse first, then int8 dynamic quantization of the weights (MatMul/Gemm)."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        fused = fuse(src, Path(tmp) / "fused.onnx", num_heads, hidden_size)
        # Fused contrib ops defeat shape inference; their outputs are float.
        quantize_dynamic(str(fused), str(dest), weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    return dest


def half(src: Path, dest: Path, num_heads: int = 0, hidden_size: int = 0) -> Path:
    """Fuse first, then fp16 weights and activations with fp32 inputs and outputs (keep_io_types), so
    clients and the signature do not change. For GPUs (tensor cores); on a CPU it runs, slower."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with tempfile.TemporaryDirectory() as tmp:
        fused = fuse(src, Path(tmp) / "fused.onnx", num_heads, hidden_size)
        model = convert_float_to_float16(onnx.load(str(fused)), keep_io_types=True)
    onnx.save(model, str(dest))
    return dest


MODES = {"fusion": fuse, "int8": quantize_int8, "fp16": half}


def sample_inputs(session: ort.InferenceSession, samples: int, seed: int = 0, vocab: int = 30000) -> list[dict]:
    """Token batches of varied lengths, as a tokenizer would produce them, one sample each."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(samples):
        length = int(rng.integers(8, 128))
        feed = {}
        for inp in session.get_inputs():
            if "mask" in inp.name:
                feed[inp.name] = np.ones((1, length), dtype=np.int64)
            elif "type" in inp.name:
                feed[inp.name] = np.zeros((1, length), dtype=np.int64)
            else:
                ids = rng.integers(1000, vocab, size=(1, length), dtype=np.int64)
                ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
                feed[inp.name] = ids
        batches.append(feed)
    return batches


def agreement(original: Path, optimized: Path, samples: int = 64) -> tuple[float, float]:
    opts = ort.SessionOptions()
    a = ort.InferenceSession(str(original), opts, providers=["CPUExecutionProvider"])
    b = ort.InferenceSession(str(optimized), opts, providers=["CPUExecutionProvider"])
    same, worst = 0, 0.0
    for feed in sample_inputs(a, samples):
        la, lb = a.run(None, feed)[0], b.run(None, feed)[0]
        same += int(np.argmax(la) == np.argmax(lb))
        worst = max(worst, float(np.abs(la - lb).max()))
    return same / samples, worst


def optimize(src: Path, mode: str, out_dir: Path | None = None, samples: int = 64,
             num_heads: int = 0, hidden_size: int = 0) -> OptimizationReport:
    if mode not in MODES:
        raise ValueError(f"--optimize must be one of {', '.join(MODES)}, not {mode!r}")
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="serving-opt-"))
    dest = out_dir / f"{src.stem}.{mode}.onnx"
    MODES[mode](src, dest, num_heads, hidden_size)
    agree, worst = agreement(src, dest, samples)
    return OptimizationReport(mode, dest, samples, agree, worst, src.stat().st_size, dest.stat().st_size)

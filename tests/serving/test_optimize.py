"""Registration-time optimization: fusions keep predictions, int8 shrinks the model, both report agreement."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from serving.optimize import optimize, sample_inputs


def test_fusion_keeps_logits(tiny_model, tmp_path):
    report = optimize(tiny_model.onnx_path, "fusion", tmp_path, samples=16, num_heads=2, hidden_size=128)
    assert report.label_agreement == 1.0
    assert report.max_abs_logit_diff < 1e-4
    sess = ort.InferenceSession(str(report.path), providers=["CPUExecutionProvider"])
    ops = {n.op_type for n in __import__("onnx").load(str(report.path)).graph.node}
    assert "Attention" in ops or "MultiHeadAttention" in ops, ops
    assert sess.run(None, sample_inputs(sess, 1)[0])[0].shape == (1, 2)


def test_int8_is_smaller_and_reported(tiny_model, tmp_path):
    report = optimize(tiny_model.onnx_path, "int8", tmp_path, samples=16, num_heads=2, hidden_size=128)
    assert report.size_after < report.size_before / 2
    assert 0.0 <= report.label_agreement <= 1.0
    assert np.isfinite(report.max_abs_logit_diff) and report.max_abs_logit_diff < 1.0
    assert report.as_metadata()["optimize"] == "int8"


def test_fp16_halves_the_weights_keeps_fp32_io_and_the_labels(tiny_model, tmp_path):
    """fp16 is for GPU workers; onnxruntime's CPU provider runs it too, which is how it is checked here."""
    import onnx

    report = optimize(tiny_model.onnx_path, "fp16", tmp_path, samples=16, num_heads=2, hidden_size=128)
    assert report.size_after < report.size_before * 0.6
    model = onnx.load(str(report.path))
    assert {i.type.tensor_type.elem_type for i in model.graph.output} == {onnx.TensorProto.FLOAT}
    assert report.max_abs_logit_diff < 0.05 and report.label_agreement >= 0.9, report

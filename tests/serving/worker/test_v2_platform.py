"""v2 metadata's ``platform`` (and gRPC ModelConfig's platform/backend) say what Triton would: the
format of the version answering on engine ``triton``, ONNX's on engine ``onnxruntime``, the engine's
name for the other in-worker engines. Triton itself (checked against the tritonserver of
nvidia-pytriton) answers metadata ``platform: "python"`` and a config with ``backend: "python"`` and
no platform for a Python-backend model."""
from __future__ import annotations

import pytest

from serving.worker.frontends.v2_models import platform, platform_backend
from serving.worker.runtime import Target
from tests.serving.worker.support import endpoint_spec


def target(framework: str, version: int = 1, triton_config: dict | None = None) -> Target:
    snap = {"model": "m", "version": version, "weight": 100.0, "triton_name": f"m_v{version}", "artifact": "sha",
            "framework": framework, "signature": {}}
    return Target.from_snapshot(snap, {"max_batch_size": 0, **({"triton_config": triton_config} if triton_config else {})})


@pytest.mark.parametrize("engine,framework,want", [
    ("triton", "onnx", ("onnxruntime_onnx", "onnxruntime")),
    ("triton", "python", ("", "python")),
    ("triton", "tensorrt", ("tensorrt_plan", "tensorrt")),
    ("triton", "torchscript", ("pytorch_libtorch", "pytorch")),
    ("triton", "savedmodel", ("tensorflow_savedmodel", "tensorflow")),
    ("triton", "openvino", ("", "openvino")),
    ("onnxruntime", "onnx", ("onnxruntime_onnx", "onnxruntime")),
    ("sklearn", "sklearn", ("", "sklearn")),
    ("xgboost", "xgboost", ("", "xgboost")),
    ("lightgbm", "lightgbm", ("", "lightgbm")),
    ("custom", "custom", ("", "custom")),
])
def test_each_engine_and_format_reports_triton_s_names(engine, framework, want):
    assert platform_backend(engine, target(framework)) == want
    assert platform(engine, target(framework)) == (want[0] or want[1])


def test_an_untyped_upload_reports_the_format_its_aux_config_named():
    """ClearML's huggingface README: a ``model.bin`` deployed with --aux-config platform="tensorrt_plan"."""
    named = target("custom", triton_config={"platform": "tensorrt_plan", "backend": "tensorrt"})
    assert named.framework == "tensorrt" and platform("triton", named) == "tensorrt_plan"


def test_metadata_reports_the_platform_of_the_version_asked_for(make_client, tiny_model, store, tmp_path):
    """Two versions of different formats behind one triton endpoint: each version's metadata its own."""
    spec = endpoint_spec("mixed", tiny_model, store, tmp_path, engine="triton", versions=((1, 100.0), (2, 0.0)))
    spec["targets"][1]["framework"] = "python"
    client, _ = make_client(spec)
    assert client.get("/v2/models/mixed").json()["platform"] == "onnxruntime_onnx"  # the live version, 1
    assert client.get("/v2/models/mixed/versions/1").json()["platform"] == "onnxruntime_onnx"
    assert client.get("/v2/models/mixed/versions/2").json()["platform"] == "python"

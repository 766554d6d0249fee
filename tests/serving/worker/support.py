"""Snapshots and artifact stores for worker tests, shaped exactly as the control plane builds them."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from preprocess.loader import pack_directory
from registry.artifacts import ArtifactStore
from serving.settings import WorkerSettings
from serving.testmodels import ModelBundle


def store_bytes(store: ArtifactStore, data: bytes, tmp: Path, name: str) -> str:
    path = tmp / name
    path.write_bytes(data)
    return store.put_file(path)[0]


def endpoint_spec(name: str, bundle: ModelBundle, store: ArtifactStore, tmp: Path, *, engine: str = "onnxruntime",
                  versions: tuple[tuple[int, float], ...] = ((1, 100.0),), preprocess: dict | None = None,
                  model: str = "clf") -> dict[str, Any]:
    model_sha = store.put_file(bundle.onnx_path)[0]
    if preprocess is None:
        tok_sha = store_bytes(store, pack_directory(bundle.tokenizer_dir), tmp, f"{name}-tokenizer.tar.gz")
        preprocess = {"kind": "tokenizer", "artifact": tok_sha, "options": {"max_length": 128, "labels": bundle.labels}}
    targets = [{"model": model, "version": v, "weight": w, "role": "stable" if i == 0 else "canary",
                "triton_name": f"{model}_v{v}", "artifact": model_sha, "framework": "onnx",
                "signature": bundle.signature} for i, (v, w) in enumerate(versions)]
    return {"name": name, "engine": engine, "preprocess": preprocess, "targets": targets, "metrics": [],
            "log_freq": 1.0, "batching": {"max_batch_size": 8, "max_queue_delay_us": 0,
                                          "preferred_batch_sizes": [], "instances": 1}}


def snapshot(*endpoints: dict[str, Any], revision: int = 1) -> dict[str, Any]:
    return {"revision": revision, "endpoints": {e["name"]: e for e in endpoints}}


def worker_settings(home: Path, **overrides: Any) -> WorkerSettings:
    """No control plane, no statistics service: the in-process tests pass what they need."""
    return WorkerSettings(home=home, artifact_dir=home / "artifacts", statistics_enabled=False,
                          control_plane_url="http://127.0.0.1:9", **overrides)

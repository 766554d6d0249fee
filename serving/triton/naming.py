"""Triton model names, shared by the control plane, workers and both Triton flavours.

One function so a worker always asks Triton for exactly the name the repository
writer or the embedded server registered (docs/architecture.md: ``{model}_v{version}``).
"""
from __future__ import annotations

TRITON_VERSION = 1  # every registry version is its own Triton model, always at Triton version 1


def triton_model_name(model: str, version: int) -> str:
    return f"{model}_v{version}"

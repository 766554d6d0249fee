"""Engines by name: adding one is a module with a ``create(settings, artifact_path)`` and a line here
(an LLM engine's line is in serving/llm/naming.py's ``LLM_ENGINE_FACTORIES``).

Every engine is built at worker start; a framework library is imported only when a
model of it is loaded, so an engine whose library is missing costs nothing until used.
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, Callable

from serving.llm.naming import LLM_ENGINE_FACTORIES

FACTORIES: dict[str, str] = {
    "triton": "serving.worker.engines.triton:create",
    "onnxruntime": "serving.worker.engines.onnxruntime:create",
    "sklearn": "serving.worker.engines.sklearn:create",
    "xgboost": "serving.worker.engines.xgboost:create",
    "lightgbm": "serving.worker.engines.lightgbm:create",
    "custom": "serving.worker.engines.custom:create",
    "custom_async": "serving.worker.engines.custom:create_async",
    "torchserve": "serving.worker.engines.torchserve:create",
    "torch": "serving.worker.engines.torch:create",
    **LLM_ENGINE_FACTORIES,  # the LLM engines' (serving/llm/naming.py)
}


def build_engines(settings: Any, artifact_path: Callable[[str], Path]) -> dict[str, Any]:
    engines = {}
    for name, ref in FACTORIES.items():
        module, _, factory = ref.partition(":")
        engines[name] = getattr(importlib.import_module(module), factory)(settings, artifact_path)
    return engines

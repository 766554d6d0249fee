"""LightGBM boosters saved as text (``Booster.save_model``): ``Booster.predict``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.worker.engines.in_process import InProcessEngine


class LightGBMEngine(InProcessEngine):
    extra = "lightgbm"

    def load(self, path: Path) -> Any:
        import lightgbm

        return lightgbm.Booster(model_file=str(path))


def create(settings: Any, artifact_path: Any) -> LightGBMEngine:
    return LightGBMEngine(artifact_path)

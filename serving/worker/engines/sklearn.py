"""scikit-learn models saved with joblib or pickle (ClearML Serving's ``sklearn`` engine): ``model.predict``."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.worker.engines.in_process import InProcessEngine


class SklearnEngine(InProcessEngine):
    extra = "sklearn"

    def load(self, path: Path) -> Any:
        import joblib  # joblib reads plain pickles too

        return joblib.load(path)


def create(settings: Any, artifact_path: Any) -> SklearnEngine:
    return SklearnEngine(artifact_path)

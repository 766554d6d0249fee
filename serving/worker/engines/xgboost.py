"""XGBoost boosters (JSON, UBJSON or the legacy binary format): ``Booster.predict``.

ClearML's example ``preprocess`` returns an ``xgboost.DMatrix``; plain arrays and
lists are wrapped in one, since a Booster predicts only on a DMatrix."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from serving.worker.engines.in_process import InProcessEngine


class XGBoostEngine(InProcessEngine):
    extra = "xgboost"

    def load(self, path: Path) -> Any:
        import xgboost

        booster = xgboost.Booster()
        booster.load_model(str(path))
        return booster

    def predict(self, model: Any, data: Any) -> Any:
        import numpy as np
        import xgboost

        if isinstance(model, xgboost.Booster) and not isinstance(data, xgboost.DMatrix):
            data = xgboost.DMatrix(np.asarray(data, dtype=np.float32))
        return model.predict(data)


def create(settings: Any, artifact_path: Any) -> XGBoostEngine:
    return XGBoostEngine(artifact_path)

"""Small models for the fixtures in ``examples/``, trained or built here in seconds.

One of each kind a ClearML Serving user deploys: scikit-learn (a classifier, an ensemble), XGBoost,
LightGBM, and ONNX networks for the Triton engine carrying the tensor names the ClearML-form
commands declare (``INPUT__0``/``OUTPUT__0``, ``dense_input``/``activation_2``, ``output``). The
image networks are trained on the seven-segment digits of digits.py, so they read the pictures the
tests post.
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

from tests.serving.clearml import digits

EXAMPLES = Path(__file__).with_name("examples")
TOKENIZER_REPO_ID = "serving-tests/tiny-bert-tokenizer"  # the huggingface fixture asks the hub cache for it


def example_module(relative: str) -> ModuleType:
    """Import a fixture's preprocess file as the worker would, to run it directly as the reference."""
    path = EXAMPLES / relative
    name = "clearml_fixture_" + relative.replace("/", "_").removesuffix(".py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def sklearn_logistic(out: Path, n_features: int = 2) -> Path:
    import joblib
    from sklearn.datasets import make_blobs
    from sklearn.linear_model import LogisticRegression

    X, y = make_blobs(n_samples=100, centers=2, n_features=n_features, random_state=1)
    path = out / f"sklearn-model-{n_features}.pkl"
    joblib.dump(LogisticRegression().fit(X, y), path, compress=9)
    return path


def sklearn_ensemble(out: Path) -> Path:
    import joblib
    from sklearn.datasets import make_blobs
    from sklearn.ensemble import RandomForestRegressor, VotingRegressor
    from sklearn.neighbors import KNeighborsRegressor

    X, y = make_blobs(n_samples=100, centers=2, n_features=2, random_state=1)
    ensemble = VotingRegressor([("knn", KNeighborsRegressor(n_neighbors=5)),
                                ("rf", RandomForestRegressor(n_estimators=10, random_state=0))]).fit(X, y)
    path = out / "ensemble-vr.pkl"
    joblib.dump(ensemble, path, compress=9)
    return path


def _iris() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_iris

    return load_iris(return_X_y=True)


def xgboost_regressor(out: Path) -> Path:
    import xgboost as xgb

    X, y = _iris()
    booster = xgb.train({"objective": "reg:squarederror", "eval_metric": "rmse"}, xgb.DMatrix(X, label=y),
                        num_boost_round=20)
    path = out / "xgb_model.json"
    booster.save_model(str(path))
    return path


def lightgbm_multiclass(out: Path) -> Path:
    import lightgbm as lgb

    X, y = _iris()
    params = {"objective": "multiclass", "metric": "softmax", "num_class": 3, "verbose": -1}
    booster = lgb.train(params, lgb.Dataset(X, label=y), num_boost_round=10)
    path = out / "lgbm_model.txt"
    booster.save_model(str(path))
    return path


def _export(module, example: "object", path: Path, input_name: str, output_name: str) -> Path:
    import torch

    torch.onnx.export(module.eval(), example, str(path), input_names=[input_name], output_names=[output_name],
                      dynamic_axes={output_name: {0: "batch"}}, opset_version=17, dynamo=False)
    return path


def digit_cnn(out: Path) -> Path:
    """Two convolutions and a linear layer, trained on seven-segment digits; exported taking one
    unbatched [1, 28, 28] picture of 0-255 pixels (``--input-size 1 28 28``), probabilities out."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Reader(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                                          nn.Conv2d(6, 12, 5), nn.ReLU(), nn.MaxPool2d(2))
            self.head = nn.Linear(12 * 4 * 4, 10)

        def forward(self, x):
            x = self.features(x.unsqueeze(1) / 255.0)
            return torch.softmax(self.head(x.flatten(1)), dim=1)

    net = Reader()
    digits.fit(net, *digits.training_set())
    return _export(net, torch.zeros(1, 28, 28), out / "digits-cnn.onnx", "INPUT__0", "OUTPUT__0")


def digit_dense(out: Path) -> Path:
    """A two-layer perceptron on the 784 pixels (0-255, any batch), trained on seven-segment digits."""
    import onnx
    import torch
    from torch import nn

    torch.manual_seed(1)

    class Pixels(nn.Module):  # raw 0-255 pixels in, as the keras fixture sends them
        def forward(self, x):
            return x.flatten(1) / 255.0

    net = nn.Sequential(Pixels(), nn.Linear(784, 64), nn.ReLU(), nn.Linear(64, 10), nn.Softmax(dim=1))
    digits.fit(net, *digits.training_set(seed=1))
    path = _export(net, torch.zeros(1, 784), out / "digits-dense.onnx", "dense_input", "activation_2")
    model = onnx.load(str(path))  # the batch dimension is free
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, str(path))
    return path


def renamed_output(onnx_path: Path, out: Path, name: str = "output") -> Path:
    """The tiny BERT classifier with its output named as the huggingface command declares it."""
    import onnx
    from onnx import helper

    model = onnx.load(str(onnx_path))
    old = model.graph.output[0]
    model.graph.node.append(helper.make_node("Identity", [old.name], [name]))
    new = onnx.ValueInfoProto()
    new.CopyFrom(old)
    new.name = name
    del model.graph.output[:]
    model.graph.output.append(new)
    path = out / "bert-output.onnx"
    onnx.save(model, str(path))
    return path


def seed_hf_cache(hf_home: Path, tokenizer_dir: Path) -> None:
    """The hub cannot be reached here: put a local tokenizer in the Hugging Face cache under the repo id
    the huggingface fixture asks for, so ``from_pretrained`` finds it offline (HF_HUB_OFFLINE=1)."""
    repo = hf_home / "hub" / ("models--" + TOKENIZER_REPO_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / "local"
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, snapshot / f.name)
    if not (snapshot / "config.json").exists():  # AutoTokenizer reads the model type from it
        (snapshot / "config.json").write_text('{"model_type": "bert"}')
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("local")

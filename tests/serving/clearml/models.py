"""Small models of the kinds ClearML Serving's examples serve, built here in seconds.

Each is trained (or exported) the way the example's ``train_*.py`` does it, smaller:
the examples' own training scripts need a ClearML server and the MNIST download.
The ONNX models carry the tensor names the examples' READMEs declare
(``INPUT__0``/``OUTPUT__0``, ``dense_input``/``activation_2``, ``output``).
"""
from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import numpy as np

EXAMPLES = Path(__file__).with_name("examples")
HF_REPO_ID = "philschmid/MiniLM-L6-H384-uncased-sst2"  # what the huggingface example's preprocess loads


def example_module(relative: str) -> ModuleType:
    """Import an example's preprocess file as the worker would, to run it directly as the reference."""
    path = EXAMPLES / relative
    name = "clearml_example_" + relative.replace("/", "_").removesuffix(".py")
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


def mnist_cnn(out: Path) -> Path:
    """The PyTorch example's network (two convolutions, two linear layers), random weights, taking the
    unbatched [1, 28, 28] image its README declares (``--input-size 1 28 28``) as TorchScript does."""
    import torch
    from torch import nn

    torch.manual_seed(0)

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 10, 5), nn.Conv2d(10, 20, 5)
            self.fc1, self.fc2 = nn.Linear(320, 50), nn.Linear(50, 10)

        def forward(self, x):
            x = torch.relu(torch.max_pool2d(self.conv1(x.unsqueeze(0) / 255.0), 2))
            x = torch.relu(torch.max_pool2d(self.conv2(x), 2))
            x = torch.relu(self.fc1(x.reshape(-1, 320)))
            return torch.log_softmax(self.fc2(x), dim=1)

    return _export(Net(), torch.zeros(1, 28, 28), out / "mnist.onnx", "INPUT__0", "OUTPUT__0")


def mnist_dense(out: Path) -> Path:
    """The Keras example's network (784 -> 512 -> 512 -> 10, softmax), random weights."""
    import torch
    from torch import nn

    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10),
                        nn.Softmax(dim=1))
    with torch.no_grad():
        net[0].weight.mul_(1 / 255.0)  # raw 0-255 pixels in, as the example's preprocess sends them
    path = _export(net, torch.zeros(1, 784), out / "mnist-dense.onnx", "dense_input", "activation_2")
    import onnx

    model = onnx.load(str(path))  # the batch dimension is free, as Keras' (None, 784)
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    onnx.save(model, str(path))
    return path


def renamed_output(onnx_path: Path, out: Path, name: str = "output") -> Path:
    """The tiny BERT classifier with its output named as the huggingface example declares it."""
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
    the example's ``preprocess.py`` asks for, so ``from_pretrained`` finds it offline (HF_HUB_OFFLINE=1)."""
    repo = hf_home / "hub" / ("models--" + HF_REPO_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / "local"
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, snapshot / f.name)
    if not (snapshot / "config.json").exists():  # AutoTokenizer reads the model type from it
        (snapshot / "config.json").write_text('{"model_type": "bert"}')
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text("local")

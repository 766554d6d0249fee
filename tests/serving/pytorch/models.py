"""Tiny PyTorch models of each kind, written by torch itself, and torch's own answers to compare with.

Each maker writes its files under a folder and returns a :class:`Made`: the upload arguments and a
``reference`` function running the user's model as the user would (torch.jit.load, torch.export.load,
or the model file imported and its weights loaded), never through serving/pytorch/.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

# a state dict's model file with two inputs (floats, token ids of any length) and named outputs
TWO_INPUTS = '''
import torch


class Scorer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)
        self.emb = torch.nn.Embedding(4, 3)

    def forward(self, x, ids):
        pooled = self.emb(ids).mean(1)
        return {"probs": torch.softmax(self.fc(x) + pooled, dim=-1), "pooled": pooled}
'''

# Python control flow on the batch size: tracing (the ONNX export) bakes in the branch it traced
BATCH_GATE = '''
import torch


class Gate(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        y = self.fc(x)
        if x.shape[0] > 2:
            return y * 2
        return y
'''

# torch.fft has no ONNX operator in the TorchScript-based exporter
SPECTRUM = '''
import torch


class Spectrum(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.fft.rfft(self.fc(x)).abs()
'''

# a dense layer: what every kind exports cleanly
DENSE = '''
import torch


class Dense(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.softmax(self.fc(x), dim=-1)
'''


@dataclass
class Made:
    path: Path
    args: list[str]  # the upload flags besides --name and --path
    reference: Callable[..., dict[str, np.ndarray]]  # numpy inputs (by name) -> torch's outputs (by name)


def module_of(folder: Path, source: str, name: str) -> Any:
    """Import a model file as its user would."""
    file = folder / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(f"user_{name}_{abs(hash(str(folder)))}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _built(folder: Path, source: str, name: str, cls: str) -> Any:
    import torch

    torch.manual_seed(0)
    return getattr(module_of(folder, source, name), cls)().eval()


def _run(model: Any, names: list[str], out_names: list[str] | None = None) -> Callable[..., dict[str, np.ndarray]]:
    import torch

    def reference(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        with torch.no_grad():
            out = model(*[torch.from_numpy(np.asarray(inputs[n])) for n in names])
        if isinstance(out, dict):
            return {k: v.numpy() for k, v in out.items()}
        outs = out if isinstance(out, tuple) else (out,)
        return {(out_names or [f"output__{i}" for i in range(len(outs))])[i]: t.numpy() for i, t in enumerate(outs)}

    return reference


def torchscript(folder: Path, source: str = DENSE, cls: str = "Dense") -> Made:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{cls.lower()}.pt"
    torch.jit.save(torch.jit.script(_built(folder, source, f"{cls.lower()}_src", cls)), str(path))
    return Made(path, ["--input-size", "4"], _run(torch.jit.load(str(path)), ["x"]))


def exported_program(folder: Path, source: str = DENSE, cls: str = "Dense") -> Made:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{cls.lower()}.pt2"
    model = _built(folder, source, f"{cls.lower()}_src", cls)
    program = torch.export.export(model, (torch.randn(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    torch.export.save(program, str(path))
    return Made(path, [], _run(torch.export.load(str(path)).module(), ["x"]))


def state_dict(folder: Path, source: str, cls: str, args: list[str], names: list[str]) -> Made:
    """weights.pt by torch.save(model.state_dict()), beside the model file the upload names."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    model = _built(folder, source, "model", cls)
    weights = folder / "weights.pt"
    torch.save(model.state_dict(), weights)
    fresh = getattr(module_of(folder, source, "model"), cls)()
    fresh.load_state_dict(torch.load(weights))
    return Made(weights, ["--model-file", str(folder / "model.py"), *args], _run(fresh.eval(), names))


def two_inputs(folder: Path) -> Made:
    return state_dict(folder, TWO_INPUTS, "Scorer", ["--input-size", "[4]", "--input-size", "[-1]",
                                                     "--input-type", "float32", "--input-type", "int64"], ["x", "ids"])


def batch_gate(folder: Path) -> Made:
    return state_dict(folder, BATCH_GATE, "Gate", ["--input-size", "4"], ["x"])


def spectrum(folder: Path) -> Made:
    return torchscript(folder, SPECTRUM, "Spectrum")

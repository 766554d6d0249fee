"""Triton models of every format, as a Triton user has them in a model repository, written here.

* a Python-backend model of ours (``shout``): a string input, two outputs (the text upper-cased
  with the suffix its config.pbtxt's parameters give, and its length in characters); it really
  runs, on the embedded Triton;
* TorchScript, made for real with torch;
* TensorRT plans, SavedModels and OpenVINO IR cannot be built here (no TensorRT, TensorFlow or
  OpenVINO installed): tiny stand-in bytes in each format's file layout, enough for the repository
  writer and its config.pbtxt checks, which never read the model's bytes.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import numpy as np

SHOUT_PY = '''\
"""Upper-cases each text and counts its characters (Triton Python backend)."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def shout(texts, suffix):
    return [t.upper() + suffix for t in texts], [len(t) for t in texts]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.suffix = config["parameters"]["suffix"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper, length = shout([b.decode("utf-8") for b in raw.reshape(-1)], self.suffix)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("UPPER", np.array([u.encode("utf-8") for u in upper], dtype=np.object_).reshape(raw.shape)),
                pb_utils.Tensor("LENGTH", np.array(length, dtype=np.int32).reshape(raw.shape)),
            ]))
        return responses
'''

SHOUT_CONFIG = '''\
name: "shout"
backend: "python"
max_batch_size: 0
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] }} ]
output [
  {{ name: "UPPER" data_type: TYPE_STRING dims: [ -1 ] }},
  {{ name: "LENGTH" data_type: TYPE_INT32 dims: [ -1 ] }}
]
parameters {{ key: "suffix" value {{ string_value: "{suffix}" }} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
'''


def shout_folder(root: Path, suffix: str = "", version: str = "1") -> Path:
    """``root/shout/config.pbtxt`` + ``root/shout/<version>/model.py``, as in a Triton repository."""
    folder = root / "shout"
    (folder / version).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(SHOUT_CONFIG.format(suffix=suffix))
    (folder / version / "model.py").write_text(SHOUT_PY)
    return folder


AUTO_COMPLETE = '''
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]}]
        outputs = [{"name": "UPPER", "data_type": "TYPE_STRING", "dims": [-1]},
                   {"name": "LENGTH", "data_type": "TYPE_INT32", "dims": [-1]}]
        for tensor in inputs:
            auto_complete_model_config.add_input(tensor)
        for tensor in outputs:
            auto_complete_model_config.add_output(tensor)
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

'''


def shout_alone(root: Path, auto_complete: bool) -> Path:
    """``root/1/model.py`` alone, no config.pbtxt: its suffix defaults to none, and with ``auto_complete`` it
    declares its tensors as Triton's auto_complete_config does."""
    model_py = root / "1" / "model.py"
    model_py.parent.mkdir(parents=True, exist_ok=True)
    source = SHOUT_PY.replace('self.suffix = config["parameters"]["suffix"]["string_value"]',
                              'self.suffix = config.get("parameters", {}).get("suffix", {}).get("string_value", "")')
    if auto_complete:
        source = source.replace("    def initialize(self, args):", AUTO_COMPLETE + "    def initialize(self, args):")
    model_py.write_text(source)
    return model_py


class _FakeBackendUtils(types.ModuleType):
    """Triton's ``triton_python_backend_utils`` exists only inside its stub process: the few calls
    model.py makes, so the test can run model.py itself, outside Triton."""

    class Tensor:
        def __init__(self, name, array):
            self.name, self.array = name, array

        def as_numpy(self):
            return self.array

    class InferenceResponse:
        def __init__(self, output_tensors, error=None):
            self.output_tensors, self.error = output_tensors, error

    @staticmethod
    def get_input_tensor_by_name(request, name):
        return request[name]


def run_model_py(folder: Path, texts: list[str], suffix: str) -> dict[str, np.ndarray]:
    """The answer of the folder's own model.py, run directly (its execute, one request)."""
    import json

    sys.modules["triton_python_backend_utils"] = _FakeBackendUtils("triton_python_backend_utils")
    try:
        version = max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
        spec = importlib.util.spec_from_file_location(f"model_{id(folder)}", version / "model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop("triton_python_backend_utils", None)
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps({"parameters": {"suffix": {"string_value": suffix}}})})
    pb = _FakeBackendUtils
    request = {"TEXT": pb.Tensor("TEXT", np.array([t.encode() for t in texts], dtype=np.object_))}
    (response,) = model.execute([request])
    return {t.name: t.array for t in response.output_tensors}


def torchscript_file(path: Path) -> Path:
    import torch

    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2))), str(path))
    return path


def tensorrt_plan(path: Path) -> Path:
    """Stand-in bytes (no TensorRT here): the writer places the file, it never parses it."""
    path.write_bytes(b"ftrt\x00stand-in TensorRT plan, not loadable")
    return path


def savedmodel_dir(path: Path) -> Path:
    """A SavedModel folder's layout with stand-in bytes (no TensorFlow here)."""
    (path / "variables").mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(b"\x08\x01stand-in saved_model.pb")
    (path / "variables" / "variables.index").write_bytes(b"stand-in index")
    return path


def openvino_files(path: Path) -> Path:
    """``model.xml`` + ``model.bin`` with stand-in content (no OpenVINO here)."""
    path.write_text('<?xml version="1.0"?>\n<net name="stand-in" version="11"><layers/><edges/></net>\n')
    path.with_suffix(".bin").write_bytes(b"\x00" * 16)
    return path

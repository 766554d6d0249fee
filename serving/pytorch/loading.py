"""Build the callable torch model of each kind from its artifact: the same code in the CLI (for the
export and the agreement check) and in the worker (engine torch), so both run the same module.

A state dict's model file is Python the user wrote: it is executed here, in the CLI on the user's
machine and in the worker that serves it (as a ``preprocess.py`` is), never in the control plane.
The class is the one ``nn.Module`` subclass the file defines (``torch-model-archiver``'s rule for
``--model-file``), unless one is named; it is built without arguments and gets the weights with
``load_state_dict(strict=True)``, so a file that does not match its weights fails at upload.
"""
from __future__ import annotations

import hashlib
import io
import sys
import tarfile
import types
import warnings
from pathlib import Path
from typing import Any

from serving.pytorch.archive import ArchiveError, StateDictArchive, read_archive
from serving.pytorch.kinds import STATE_DICT, TORCH_EXPORT, TORCHSCRIPT

_NESTED = ("state_dict", "model_state_dict", "model")  # training checkpoints keep the weights under one of these


class ModelLoadError(ValueError):
    """The artifact cannot be made into a model (a message for the user, naming what is wrong)."""


def load_module(path: Path, framework: str) -> Any:
    """The model to call with positional tensors, in eval mode."""
    import torch

    if framework == TORCHSCRIPT:
        with warnings.catch_warnings():  # torch 2.10+ calls TorchScript deprecated; the files exist all the same
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(io.BytesIO(_torchscript_bytes(Path(path))), map_location="cpu").eval()
    if framework == TORCH_EXPORT:
        return load_program(Path(path)).module()
    if framework == STATE_DICT:
        try:
            return state_dict_module(read_archive(Path(path)))
        except ArchiveError as exc:
            raise ModelLoadError(str(exc)) from None
    raise ModelLoadError(f"engine torch serves {TORCHSCRIPT}, {TORCH_EXPORT} and {STATE_DICT} models, not {framework}")


def load_program(path: Path) -> Any:
    import torch

    try:
        with open(path, "rb") as f:  # a file object: the artifact store's names have no .pt2 suffix
            return torch.export.load(f)
    except Exception as exc:  # torch raises its own types for a damaged or newer archive
        raise ModelLoadError(f"torch.export.load cannot read it: {type(exc).__name__}: {exc}") from None


def _torchscript_bytes(path: Path) -> bytes:
    """The file itself, or the model file of a Triton model folder (tar.gz, serving/triton/model_folder.py)."""
    from serving.triton.model_folder import VERSION_DIR, is_archive, model_file, parse_config
    from serving.triton.model_formats import FORMATS

    if not is_archive(path):
        return path.read_bytes()
    with tarfile.open(path) as tar:
        names = tar.getnames()
        cfg = parse_config(tar.extractfile("config.pbtxt").read().decode()) if "config.pbtxt" in names else None
        wanted = f"{VERSION_DIR}/{model_file(FORMATS[TORCHSCRIPT], cfg)}"
        if wanted not in names:
            raise ModelLoadError(f"the TorchScript model folder holds no {wanted}")
        return tar.extractfile(wanted).read()


def module_from_source(source: str, label: str = "model.py") -> types.ModuleType:
    """Execute a model file as a module of its own (named by its content's hash, registered in
    sys.modules so that dataclasses and pickling inside it find it)."""
    name = f"serving_user_model_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    if name in sys.modules:
        return sys.modules[name]
    module = types.ModuleType(name)
    module.__file__ = label
    sys.modules[name] = module
    try:
        exec(compile(source, label, "exec"), module.__dict__)
    except Exception as exc:
        del sys.modules[name]
        hint = " (the model file must be self-contained: one file, as TorchServe's --model-file)" \
            if isinstance(exc, ImportError) else ""
        raise ModelLoadError(f"{label} fails to import: {type(exc).__name__}: {exc}{hint}") from None
    return module


def module_classes(module: types.ModuleType) -> list[str]:
    """The ``nn.Module`` subclasses the file itself defines (not those it imports), in file order."""
    import torch

    found = [v for v in vars(module).values()
             if isinstance(v, type) and issubclass(v, torch.nn.Module) and v.__module__ == module.__name__]
    return [c.__name__ for c in found]


def pick_class(module: types.ModuleType, wanted: str | None, label: str = "the model file") -> str:
    classes = module_classes(module)
    if wanted is not None:
        if wanted not in classes:
            raise ModelLoadError(f"{label} defines no nn.Module class {wanted!r} (it defines: "
                                 f"{', '.join(classes) or 'none'})")
        return wanted
    if len(classes) != 1:
        raise ModelLoadError(f"{label} must define exactly one nn.Module subclass, as TorchServe's --model-file "
                             f"does (it defines {', '.join(classes) or 'none'}); name the model's with --model-class")
    return classes[0]


def state_dict_module(archive: StateDictArchive) -> Any:
    module = module_from_source(archive.source)
    cls = getattr(module, archive.model_class, None)
    if cls is None:
        raise ModelLoadError(f"the model file defines no class {archive.model_class!r}")
    try:
        model = cls()
    except Exception as exc:
        raise ModelLoadError(f"{archive.model_class}() fails: {type(exc).__name__}: {exc} (the class is built "
                             "without arguments, as TorchServe builds it)") from None
    try:
        model.load_state_dict(_weights(archive), strict=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"the weights do not fit {archive.model_class}: {exc}") from None
    return model.eval()


def _weights(archive: StateDictArchive) -> dict[str, Any]:
    import torch

    try:
        if archive.weights_name.endswith(".safetensors"):
            from safetensors.torch import load as load_safetensors

            return load_safetensors(archive.weights)
        state = torch.load(io.BytesIO(archive.weights), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch's unpickler refuses anything but tensors and plain containers
        raise ModelLoadError(f"the weights are not a state dict torch.load can read safely: "
                             f"{type(exc).__name__}: {exc}") from None
    if isinstance(state, dict) and not all(isinstance(v, torch.Tensor) for v in state.values()):
        state = next((state[k] for k in _NESTED if isinstance(state.get(k), dict)), state)
    if not isinstance(state, dict):
        raise ModelLoadError(f"the weights file holds {type(state).__name__}, not a state dict")
    return state


def flatten(out: Any) -> list[Any]:
    """A model's outputs as a flat list of tensors: a tensor, (nested) tuples and lists, dict values."""
    if isinstance(out, dict):
        return [t for v in out.values() for t in flatten(v)]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in flatten(v)]
    return [out]


def output_keys(out: Any) -> list[str] | None:
    """A dict of tensors names its outputs itself."""
    import torch

    if isinstance(out, dict) and all(isinstance(v, torch.Tensor) for v in out.values()):
        return [str(k) for k in out]
    return None


def forward_names(model: Any) -> list[str]:
    """The names of ``forward``'s tensor parameters, in order (TorchScript: its schema's)."""
    import inspect

    schema = getattr(getattr(model, "forward", None), "schema", None)
    if schema is not None:
        return [a.name for a in schema.arguments[1:]]
    params = inspect.signature(model.forward).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]

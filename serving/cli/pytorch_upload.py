"""`serving model upload` of a plain PyTorch file: TorchScript, a ``.pt2``, or a state dict with
``--model-file``. The model is loaded here, exported to ONNX and checked against torch
(serving/pytorch/choose.py: why on the client), and what is uploaded is the ONNX file or the PyTorch
artifact, with the runtime chosen and why printed and kept in the version's metadata.
"""
from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import typer

from serving.cli.client import ControlPlane
from serving.cli.clearml_flags import parse_sizes
from serving.cli.output import console
from serving.pytorch.kinds import STATE_DICT, WORDS, file_kind

# --framework values a PyTorch file may come with (ClearML's, Triton's, the registry's)
TORCH_FRAMEWORKS = ("", "pytorch", "torch", "torchscript", "pytorch_libtorch", "torch-export", "pytorch-state-dict")
_CHECKPOINTS = ("a PyTorch checkpoint (torch.save)", "a safetensors file")


@dataclass(frozen=True)
class PytorchOptions:
    """The upload flags that concern PyTorch files."""

    model_file: Optional[Path] = None
    model_class: Optional[str] = None
    runtime: Optional[str] = None
    input_name: list[str] = field(default_factory=list)
    input_type: list[str] = field(default_factory=list)
    input_size: list[str] = field(default_factory=list)
    output_name: list[str] = field(default_factory=list)
    optimize: Optional[str] = None

    def flags_given(self) -> list[str]:
        given = {"--model-class": self.model_class, "--runtime": self.runtime, "--input-name": self.input_name,
                 "--input-type": self.input_type, "--input-size": self.input_size, "--output-name": self.output_name}
        return [flag for flag, value in given.items() if value]


def pytorch_kind_of(path: Path, framework: Optional[str], model_file: Optional[Path]) -> str | None:
    """The PyTorch kind this upload is (``torchscript``, ``torch-export``, ``pytorch-state-dict``), or None
    when it is something else (then the other upload paths apply)."""
    from registry.signature import pytorch_kind

    named = (framework or "").strip().lower()
    if named not in TORCH_FRAMEWORKS:
        if model_file is not None:
            raise typer.BadParameter(f"--model-file goes with a PyTorch state dict; --framework {framework} says "
                                     "the file is something else", param_hint="--model-file")
        return None
    if model_file is not None:
        found = pytorch_kind(path) if path.is_file() else None
        if found not in _CHECKPOINTS:
            raise typer.BadParameter(f"--model-file goes with a state dict saved by torch.save (or a safetensors "
                                     f"file); {path} is {found or 'neither'}", param_hint="--path")
        return STATE_DICT
    if named == STATE_DICT:
        raise typer.BadParameter("a state dict is served with the Python file defining its nn.Module class: give "
                                 "it with --model-file", param_hint="--model-file")
    return file_kind(path)


def upload_pytorch(cp: ControlPlane, name: str, path: Path, framework: Optional[str], tags: list[str],
                   metadata: Optional[str], options: PytorchOptions) -> bool:
    """Upload and register ``path`` if it is a PyTorch file (True), else leave it to the caller (False)."""
    kind = pytorch_kind_of(path, framework, options.model_file)
    if kind is None:
        stray = options.flags_given()
        if stray:
            raise typer.BadParameter(f"{', '.join(stray)}: for PyTorch files (TorchScript, a .pt2, or a state dict "
                                     f"with --model-file); {path} is none of them")
        return False
    runtime = _runtime(options.runtime)
    if options.optimize:
        raise typer.BadParameter("--optimize is for ONNX files: upload the PyTorch file without it (its ONNX "
                                 "export is checked against torch as it is)", param_hint="--optimize")
    meta = _metadata(metadata)
    with tempfile.TemporaryDirectory(prefix="serving-pytorch-") as tmp:
        prepared = _prepare(path, kind, Path(tmp), runtime, options)
        console.print(f"runtime: [bold]{prepared.runtime}[/bold] ({prepared.reason})")
        label = f"uploading {path.name}" + (" as ONNX" if prepared.runtime == "onnx" else "")
        sha = cp.upload_file(prepared.path, label)
        body: dict[str, Any] = {"name": name, "artifact": sha, "framework": prepared.framework, "tags": tags,
                                "metadata": {**meta, **prepared.metadata}}
        if prepared.signature is not None:
            body["signature"] = prepared.signature
        m = cp.post("/models", json=body)
    engine = "torch" if prepared.runtime == "torch" else "triton or onnxruntime"
    console.print(f"registered [bold]{m['name']}:{m['version']}[/bold] (model id {m.get('id')}, {m['size']} bytes, "
                  f"sha256 {m['sha256'][:12]}), {WORDS[kind]} served as {m['framework']} (engine {engine})")
    for skip in m.get("not_followed") or ():
        console.print(f"note: endpoint {skip['endpoint']} does not follow this version: {skip['reason']}")
    return True


def _runtime(value: Optional[str]) -> str:
    from serving.pytorch.choose import RUNTIMES

    runtime = (value or "auto").strip().lower()
    if runtime not in RUNTIMES:
        raise typer.BadParameter(f"--runtime must be one of {', '.join(RUNTIMES)}, not {value!r}",
                                 param_hint="--runtime")
    return runtime


def _metadata(text: Optional[str]) -> dict[str, Any]:
    try:
        meta = json.loads(text) if text else {}
    except ValueError as exc:
        raise typer.BadParameter(f"--metadata is not valid JSON: {exc}")
    if not isinstance(meta, dict):
        raise typer.BadParameter("--metadata must be a JSON object")
    return meta


def _prepare(path: Path, kind: str, workdir: Path, runtime: str, options: PytorchOptions) -> Any:
    """Load, export, check; every failure the user can fix is a BadParameter naming it."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise typer.BadParameter(f"{path} is {WORDS[kind]}: loading it needs PyTorch (`pip install torch`)",
                                 param_hint="--path") from None
    from serving.pytorch.choose import InputFlags, RuntimeChoiceError, decide, open_source
    from serving.pytorch.loading import ModelLoadError
    from serving.pytorch.samples import SpecError

    flags = InputFlags(options.input_name, options.input_type, parse_sizes(options.input_size, "--input-size"),
                       options.output_name)
    try:
        with console.status("loading the model, exporting it to ONNX and checking it against torch"):
            source = open_source(path, kind, workdir, flags, options.model_file, options.model_class)
            return decide(source, runtime, workdir, flags.output_names)
    except ModelLoadError as exc:
        raise typer.BadParameter(str(exc), param_hint="--model-file" if kind == STATE_DICT else "--path") from None
    except SpecError as exc:
        raise typer.BadParameter(str(exc), param_hint="--input-size") from None
    except RuntimeChoiceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--runtime") from None

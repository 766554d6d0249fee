"""`serving model upload` of a Triton model as its user has it: a model folder, or one file/folder of a
format engine ``triton`` serves (serving/triton/model_formats.py). Folders (and OpenVINO's .xml + .bin)
travel as one tar.gz artifact in the layout serving/triton/model_folder.py describes; a single-file
model as the file itself."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from serving.cli.client import ControlPlane
from serving.cli.output import console
from serving.triton.model_folder import ModelFolderError, folder_format, model_file, newest_version_dir, pack, \
    parse_config
from serving.triton.model_formats import FORMATS, TritonFormat, detect

# --framework names of Triton formats (the registry's, and Triton's platform/backend names)
_ALIASES = {**{f.name: f.name for f in FORMATS.values() if f.name != "onnx"},
            **{f.platform: f.name for f in FORMATS.values() if f.platform and f.name != "onnx"},
            "trt": "tensorrt", "tensorflow_savedmodel": "savedmodel"}


def triton_upload(path: Path, framework: Optional[str]) -> TritonFormat | None:
    """The Triton format to upload ``path`` as; None for anything else (ONNX files, scikit-learn, ...)."""
    named = (framework or "").strip().lower()
    if named in _ALIASES:
        fmt = FORMATS[_ALIASES[named]]
        if path.is_dir() and detect(path) == "folder":
            _same_format(path, fmt)
        return fmt
    if named not in ("", "pytorch", "tensorflow"):  # another framework said what the file is
        return None
    found = detect(path)
    if found == "folder":
        try:
            return folder_format(path)
        except ModelFolderError as exc:
            raise typer.BadParameter(str(exc), param_hint="--path")
    if found is None or (named == "pytorch" and found != "torchscript") or (named == "tensorflow" and found != "savedmodel"):
        return None
    return FORMATS[found]


def _same_format(folder: Path, fmt: TritonFormat) -> None:
    try:
        found = folder_format(folder)
    except ModelFolderError as exc:
        raise typer.BadParameter(str(exc), param_hint="--path")
    if found.name != fmt.name:
        raise typer.BadParameter(f"{folder} is {found.words}, not {fmt.words}", param_hint="--path")


def triton_onnx_file(folder: Path) -> Path:
    """The ONNX file of a Triton model folder: uploaded as any ONNX model (the platform writes its
    config.pbtxt from the endpoint's batching; the folder's own is not used)."""
    if not folder.is_dir():
        return folder
    config = folder / "config.pbtxt"
    cfg = parse_config(config.read_text()) if config.is_file() else None
    version = newest_version_dir(folder)
    onnx = version / model_file(FORMATS["onnx"], cfg) if version is not None else None
    if onnx is None or not onnx.is_file():
        raise typer.BadParameter(f"{folder} names the ONNX backend but holds no {version}/model.onnx",
                                 param_hint="--path")
    if cfg is not None:
        console.print(f"note: {config} is not used: ONNX models get a config.pbtxt from `serving model add` "
                      "(--max-batch-size, --aux-config ...)")
    return onnx


def upload_triton(cp: ControlPlane, path: Path, fmt: TritonFormat) -> str:
    """The artifact's sha256: the file itself for a single-file model, else the packed folder."""
    if not path.is_dir() and fmt.name != "openvino":
        return cp.upload_file(path)
    if path.is_dir() and detect(path) == "folder":
        version = newest_version_dir(path)
        others = sorted(p.name for p in path.iterdir() if p.is_dir() and p.name.isdigit() and p != version)
        if others:
            console.print(f"note: uploading version directory {version.name} (the newest) as this model version; "
                          f"{', '.join(others)} stay behind")
    if fmt.name == "openvino" and not path.is_dir() and not path.with_suffix(".bin").is_file():
        raise typer.BadParameter(f"{path} needs its weights {path.with_suffix('.bin').name} beside it",
                                 param_hint="--path")
    return cp.post("/artifacts", content=pack(path, fmt), timeout=600.0)["sha256"]


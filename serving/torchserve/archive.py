"""A TorchServe model archive (``.mar``), read as ``torch-model-archiver`` 0.12 writes it.

The archive is what a TorchServe user has: a zip (the default; ``zip-store`` too), a ``.tar.gz``
(``--archive-format tgz``) or a folder (``no-archive``), each holding ``MAR-INF/MANIFEST.json``
beside the model's files at the top. The manifest names the handler (a built-in's name, or a
module file, optionally ``module:function``), the serialized weights, the model file, and the
optional ``model-config.yaml`` (``configFile``: batch size, delay, timeout, the handler's own
keys) and ``requirements.txt``. The registry reads it at upload (the version's signature is
what is read here); the worker unpacks it once per content hash and runs its handler.
"""
from __future__ import annotations

import io
import json
import shutil
import tarfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from serving.unpacked import unpack_once

MANIFEST = "MAR-INF/MANIFEST.json"
# model-config.yaml keys the platform applies (TorchServe's names); the others are the handler's own
FRONTEND_KEYS = ("batchSize", "maxBatchDelay", "responseTimeout", "minWorkers", "maxWorkers")
DEFAULT_RESPONSE_TIMEOUT_S = 120  # TorchServe's default_response_timeout


class ArchiveError(ValueError):
    """Not an archive TorchServe could load: the message says what is wrong."""


@dataclass(frozen=True)
class ArchiveInfo:
    """What the manifest and model-config.yaml say, kept as the model version's signature."""

    model_name: str
    handler: str
    serialized_file: str = ""
    model_file: str = ""
    model_version: str = ""
    requirements_file: str = ""
    config_file: str = ""
    runtime: str = "python"
    config: dict[str, Any] = field(default_factory=dict)  # model-config.yaml, whole

    @property
    def batch_size(self) -> int:
        return int(self.config.get("batchSize") or 1)

    @property
    def max_batch_delay_ms(self) -> int:
        return int(self.config.get("maxBatchDelay") or 100)

    @property
    def response_timeout_s(self) -> int:
        return int(self.config.get("responseTimeout") or DEFAULT_RESPONSE_TIMEOUT_S)

    def signature(self) -> dict[str, Any]:
        return {"torchserve": asdict(self)}

    @classmethod
    def from_signature(cls, signature: dict[str, Any]) -> "ArchiveInfo":
        return cls(**(signature.get("torchserve") or {}))


def is_archive(path: Path) -> bool:
    """A zip, tar.gz or folder with ``MAR-INF/MANIFEST.json``: a TorchServe archive whatever its name."""
    try:
        return _read_member(Path(path), MANIFEST) is not None
    except ArchiveError:
        return False


def read_archive(path: Path) -> ArchiveInfo:
    """The manifest and model-config.yaml of an archive; ArchiveError names what is missing."""
    path = Path(path)
    raw = _read_member(path, MANIFEST)
    if raw is None:
        raise ArchiveError(f"{path.name} has no {MANIFEST}: make it with torch-model-archiver")
    try:
        manifest = json.loads(raw)
        model = manifest["model"]
        handler = str(model["handler"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ArchiveError(f"{MANIFEST} is not torch-model-archiver's manifest ({type(exc).__name__}: {exc})") from None
    if manifest.get("runtime", "python") != "python":
        raise ArchiveError(f"the archive's runtime is {manifest.get('runtime')!r}; only python handlers are served")
    config_file = str(model.get("configFile") or "")
    info = ArchiveInfo(model_name=str(model.get("modelName") or ""), handler=handler,
                       serialized_file=str(model.get("serializedFile") or ""),
                       model_file=str(model.get("modelFile") or ""), model_version=str(model.get("modelVersion") or ""),
                       requirements_file=str(model.get("requirementsFile") or ""), config_file=config_file,
                       config=_model_config(path, config_file))
    _check_files(path, info)
    return info


def _model_config(path: Path, config_file: str) -> dict[str, Any]:
    if not config_file:
        return {}
    raw = _read_member(path, config_file)
    if raw is None:
        raise ArchiveError(f"the manifest names configFile {config_file!r}, which the archive does not hold")
    import yaml

    try:
        config = yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        raise ArchiveError(f"{config_file} is not valid YAML: {exc}") from None
    if not isinstance(config, dict):
        raise ArchiveError(f"{config_file} must be a mapping of keys (batchSize, maxBatchDelay, ...)")
    for key in ("batchSize", "maxBatchDelay", "responseTimeout", "minWorkers", "maxWorkers"):
        value = config.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ArchiveError(f"{config_file}: {key} must be a whole number >= 0, not {value!r}")
    return config


def _check_files(path: Path, info: ArchiveInfo) -> None:
    for name in (info.serialized_file, info.model_file, info.requirements_file):
        if name and _read_member(path, name, probe=True) is None:
            raise ArchiveError(f"the manifest names {name!r}, which the archive does not hold")


def requirements(path: Path, info: ArchiveInfo) -> list[str]:
    """The archive's requirements.txt lines (comments and blanks left out)."""
    raw = _read_member(Path(path), info.requirements_file) if info.requirements_file else None
    lines = (raw or b"").decode("utf-8", "replace").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def _read_member(path: Path, name: str, probe: bool = False) -> bytes | None:
    """One file of the archive (None when absent); ``probe``: only whether it is there (b"")."""
    if path.is_dir():
        member = path / name
        return (b"" if probe else member.read_bytes()) if member.is_file() else None
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                if name not in archive.namelist():
                    return None
                return b"" if probe else archive.read(name)
        if tarfile.is_tarfile(path):
            with tarfile.open(path) as archive:
                member = _tar_member(archive, name)
                if member is None:
                    return None
                handle = archive.extractfile(member)
                return b"" if probe else (handle.read() if handle else None)
    except (OSError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise ArchiveError(f"{path.name} cannot be read: {exc}") from None
    return None


def _tar_member(archive: tarfile.TarFile, name: str) -> tarfile.TarInfo | None:
    """tgz archives hold the files under a folder named after the model, or at the top."""
    for member in archive.getmembers():
        if member.isfile() and (member.name == name or member.name.split("/", 1)[-1] == name):
            return member
    return None


def unpack(path: Path, dest_root: Path) -> Path:
    """The archive's files in a folder of their own, unpacked once per artifact (its file name is its
    sha256; serving/unpacked.py)."""
    return unpack_once(Path(path), dest_root, _extract)


def _extract(path: Path, dest: Path) -> None:
    if path.is_dir():
        shutil.copytree(path, dest, dirs_exist_ok=True)
        return
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                target = _inside(dest, member.filename)
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
        return
    with tarfile.open(path) as archive:
        names = [m.name for m in archive.getmembers() if m.isfile()]
        strip = "" if any(n == MANIFEST for n in names) else names[0].split("/", 1)[0] + "/" if names else ""
        for member in archive.getmembers():
            if not member.isfile():
                continue
            target = _inside(dest, member.name.removeprefix(strip))
            target.parent.mkdir(parents=True, exist_ok=True)
            handle = archive.extractfile(member)
            with open(target, "wb") as out:
                shutil.copyfileobj(handle or io.BytesIO(), out)


def _inside(dest: Path, name: str) -> Path:
    """A member's path inside ``dest``; a name leading out of it (``../``, absolute) is refused."""
    target = (dest / name).resolve()
    if dest.resolve() not in target.parents:
        raise ArchiveError(f"archive member {name!r} points outside the archive")
    return target

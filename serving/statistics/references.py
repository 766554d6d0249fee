"""Reference distributions on disk, so a restart of the statistics service does not
re-learn a reference from traffic that may already have drifted.

Layout: ``<root>/<endpoint>/<version>/<variable>.json`` holding
``{"kind": ..., "values": [...], "uploaded": bool}``; version ``*`` is an uploaded
default for every version of the endpoint that has no reference of its own.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote, unquote

log = logging.getLogger(__name__)

ANY_VERSION = "*"


@dataclass(frozen=True)
class Reference:
    endpoint: str
    version: str  # a version label, or ANY_VERSION
    variable: str
    kind: str
    values: list[Any]
    uploaded: bool


class ReferenceStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()

    def _path(self, endpoint: str, version: str, variable: str) -> Path:
        return self.root / quote(endpoint, safe="") / quote(version, safe="") / f"{quote(variable, safe='')}.json"

    def save(self, ref: Reference) -> None:
        path = self._path(ref.endpoint, ref.version, ref.variable)
        doc = {"kind": ref.kind, "values": ref.values, "uploaded": ref.uploaded}
        with self._lock:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                with os.fdopen(fd, "w") as f:
                    json.dump(doc, f)
                os.replace(tmp, path)
            except OSError as exc:  # a read-only home must not stop the statistics
                log.warning("cannot persist reference %s: %s", path, exc)

    def delete(self, endpoint: str, version: str, variable: str) -> None:
        self._path(endpoint, version, variable).unlink(missing_ok=True)

    def get(self, endpoint: str, version: str, variable: str) -> Reference | None:
        return self._load(self._path(endpoint, version, variable))

    def load_all(self) -> Iterator[Reference]:
        if not self.root.is_dir():
            return
        for path in sorted(self.root.glob("*/*/*.json")):
            ref = self._load(path)
            if ref is not None:
                yield ref

    @staticmethod
    def _load(path: Path) -> Reference | None:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return Reference(endpoint=unquote(path.parent.parent.name), version=unquote(path.parent.name),
                         variable=unquote(path.stem), kind=doc["kind"], values=doc["values"],
                         uploaded=bool(doc.get("uploaded")))

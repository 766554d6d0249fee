"""Rotating JSON Lines files: the prediction log of the embedded stack.

Each worker process writes files of its own (``predictions-<source>-<start time>.jsonl``), so several
processes never interleave lines, and a reader (``serving log export``) reads every ``*.jsonl`` of the
folder. A file past ``max_bytes`` is closed and a new one opened; past ``keep`` files of this process
the oldest is deleted (retention). Files are never renamed, so a reader never sees a file move under it.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, IO

import orjson

SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class RotatingFiles:
    name = "files"

    def __init__(self, folder: Path, source: str, max_bytes: int = 64 * 1_048_576, keep: int = 20) -> None:
        self.folder, self.max_bytes, self.keep = Path(folder), max_bytes, max(1, keep)
        self.prefix = f"predictions-{SAFE.sub('_', source)}-"
        self._file: IO[bytes] | None = None
        self._size = 0
        self._seq = 0

    def write(self, records: list[dict[str, Any]]) -> None:
        data = b"".join(orjson.dumps(r, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for r in records)
        if self._file is None or self._size + len(data) > self.max_bytes and self._size:
            self._rotate()
        assert self._file is not None
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def files(self) -> list[Path]:
        """This process's files, oldest first."""
        return sorted(self.folder.glob(f"{self.prefix}*.jsonl"))

    def _rotate(self) -> None:
        self.close()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._seq += 1
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        self._file = open(self.folder / f"{self.prefix}{stamp}-{self._seq:06d}.jsonl", "ab")
        self._size = 0
        for old in self.files()[:-self.keep]:
            old.unlink(missing_ok=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

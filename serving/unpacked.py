"""An artifact unpacked once into a folder named after it (its sha256), safely under concurrency.

Several worker processes apply the same config at once: each unpacks into a temporary folder of its
own and renames it into place, so no process ever reads a file another is still writing; a folder
left unfinished (no ``.complete``) by a crash is replaced. Tokenizer folders and TorchServe archives
both travel this way."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

COMPLETE = ".complete"


def unpack_once(artifact: Path, dest_root: Path, extract: Callable[[Path, Path], None]) -> Path:
    """``dest_root/<artifact's name>``, filled by ``extract(artifact, folder)`` the first time."""
    dest = dest_root / Path(artifact).name
    if (dest / COMPLETE).exists():
        return dest
    dest_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest_root))
    try:
        extract(Path(artifact), tmp)
        (tmp / COMPLETE).touch()
        try:
            os.rename(tmp, dest)
        except OSError:  # another process got there first, or an unfinished folder of an older version
            if not (dest / COMPLETE).exists():
                shutil.rmtree(dest, ignore_errors=True)
                os.rename(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest

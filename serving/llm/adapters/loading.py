"""LoRA adapters loaded into running engines at runtime, on every replica, without a restart.

vLLM serves ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}`` and ``/v1/unload_lora_adapter``
when started with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` (serving/llm/launch/process.py).
Each adapter's folder is fetched and unpacked once per content hash, off the launcher's loop
(:class:`AdapterFolders`); at each tick a ready replica gets the adapters its engine should hold and
loses those it should not (:func:`sync_adapters`). A replica that starts later (or restarts: its loaded
set is cleared when it dies) gets them once its ``/health`` answers. An adapter the engine refuses is
recorded with the engine's own message and not tried again on that replica until it restarts.
"""
from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import httpx

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 60.0


class Replica(Protocol):
    name: str
    url: str
    adapters: dict[str, str]
    adapter_errors: dict[str, str]


class AdapterFolders:
    """Adapter artifacts unpacked once per content hash, each on a thread of its own."""

    def __init__(self, artifact_path: Callable[[str], Path], unpack_root: Path) -> None:
        self.artifact_path, self.unpack_root = artifact_path, unpack_root
        self.ready: dict[str, Path] = {}
        self.errors: dict[str, str] = {}
        self._started: set[str] = set()
        self._lock = threading.Lock()

    def prepare(self, artifacts: Iterable[str]) -> None:
        for sha in artifacts:
            with self._lock:
                if sha in self._started:
                    continue
                self._started.add(sha)
            threading.Thread(target=self._unpack, args=(sha,), name=f"llm-adapter-{sha[:12]}", daemon=True).start()

    def _unpack(self, sha: str) -> None:
        from preprocess.loader import unpack_tokenizer as unpack_once  # a tar unpacked once per content hash

        try:
            folder = unpack_once(self.artifact_path(sha), self.unpack_root)
        except Exception as exc:
            log.exception("cannot fetch or unpack adapter %s", sha[:12])
            self.errors[sha] = f"cannot fetch or unpack the adapter folder: {exc}"
            return
        self.ready[sha] = folder


def sync_adapters(replica: Replica, wanted: dict[str, str], folders: AdapterFolders) -> bool:
    """Load what ``wanted`` (adapter name -> artifact) has and ``replica`` lacks, unload what it has and
    ``wanted`` lacks; True when anything changed."""
    changed = False
    for name in sorted(set(replica.adapters) - set(wanted)):
        _call(replica, "unload_lora_adapter", {"lora_name": name})
        del replica.adapters[name]
        log.info("engine %s: unloaded adapter %s", replica.name, name)
        changed = True
    for name, sha in sorted(wanted.items()):
        if name in replica.adapters or name in replica.adapter_errors:
            continue
        if sha in folders.errors:
            replica.adapter_errors[name] = folders.errors[sha]
            changed = True
            continue
        folder = folders.ready.get(sha)
        if folder is None:
            continue  # still being fetched
        why = _call(replica, "load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        if why is None:
            replica.adapters[name] = sha
            log.info("engine %s: loaded adapter %s from %s", replica.name, name, folder)
        else:
            replica.adapter_errors[name] = f"the engine refused adapter {name}: {why}"
            log.warning("engine %s: %s", replica.name, replica.adapter_errors[name])
        changed = True
    return changed


def _call(replica: Replica, route: str, body: dict[str, Any]) -> str | None:
    """None when the engine did it, else why not (its own message)."""
    try:
        r = httpx.post(f"{replica.url}/{route}", json=body, timeout=LOAD_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if r.status_code == 200:
        return None
    try:
        error = r.json()
        message = (error.get("error") or {}).get("message") if isinstance(error.get("error"), dict) else None
        return str(message or error.get("message") or error.get("detail") or r.text)[:400]
    except ValueError:
        return r.text[:400] or f"HTTP {r.status_code}"

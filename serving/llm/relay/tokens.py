"""Prompt lengths of LLM requests, counted in the worker with the model's own tokenizer.

Why count here at all when the engine counts too: a request past the model's context must be a 400
before it reaches the engine (it would hold a connection and a queue slot there only to be refused),
and the answer must not depend on whether the engine is up. The tokenizer comes from the model
version's artifact (the uploaded Hugging Face folder): only its tokenizer files are unpacked, once
per artifact, and the loaded tokenizer is kept while a version of the config uses it.

Counts follow what vLLM's OpenAI server does: a completion prompt is tokenized with the special
tokens the tokenizer adds (``add_special_tokens=True``); a chat is rendered with the tokenizer's
chat template (``add_generation_prompt`` as the request says, default true) and the text tokenized
without adding special tokens again. Message contents given as parts keep their text parts joined
by newlines, as vLLM's "string" content format does.
"""
from __future__ import annotations

import logging
import shutil
import tarfile
import tempfile
import threading
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterable

from serving.llm.openai.routes import ROUTES
from serving.worker.runtime import Target

log = logging.getLogger(__name__)

# the files of a Hugging Face folder a tokenizer reads; never the weights
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "vocab.txt", "merges.txt", "tokenizer.model", "config.json",
                    "generation_config.json", "chat_template.jinja", "chat_template.json")


def _wanted(name: str) -> bool:
    return Path(name).name in _TOKENIZER_FILES


def _extract(archive: Path, dest: Path) -> None:
    """Only the tokenizer's files, flattened into ``dest``: a folder packed with or without a top
    directory reads the same, and no member can write outside ``dest``."""
    if tarfile.is_tarfile(archive):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile() and _wanted(member.name):
                    source = tar.extractfile(member)
                    if source is not None:
                        (dest / Path(member.name).name).write_bytes(source.read())
    elif zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                if not info.is_dir() and _wanted(info.filename):
                    (dest / Path(info.filename).name).write_bytes(zf.read(info))
    else:
        raise ValueError(f"artifact {archive.name} is neither a folder nor a tar or zip archive of one")


def tokenizer_folder(artifact: Path, unpack_root: Path) -> Path:
    """A folder holding the artifact's tokenizer files (the artifact itself when it is a folder)."""
    if artifact.is_dir():
        return artifact
    dest = unpack_root / f"{artifact.name}-tokenizer"
    if (dest / ".complete").exists():
        return dest
    unpack_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{artifact.name}-", dir=unpack_root))
    try:
        _extract(artifact, tmp)
        (tmp / ".complete").touch()
        try:
            tmp.rename(dest)
        except OSError:  # another worker process got there first
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _rendered(tokenizer: Any, request: dict[str, Any]) -> str | None:
    """A chat's messages in the model's chat template, as vLLM renders them (None: no template)."""
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    messages = [{**m, "content": _text(m.get("content"))} for m in request["messages"]]
    return tokenizer.apply_chat_template(messages, tokenize=False,
                                         add_generation_prompt=request.get("add_generation_prompt", True),
                                         **(request.get("chat_template_kwargs") or {}))


def _text(content: Any) -> Any:
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text")
    return content


class PromptCounter:
    """Tokenizers of the LLM versions in the config, by artifact; counts are blocking calls (run them
    off the event loop)."""

    def __init__(self, artifact_path: Callable[[str], Path], unpack_root: Path) -> None:
        self.artifact_path = artifact_path
        self.unpack_root = unpack_root
        self._tokenizers: dict[str, Any] = {}
        self._lock = threading.Lock()

    def prepare(self, target: Target) -> None:
        """Load the version's tokenizer when the config is applied (never on a request)."""
        if target.tokenizer_artifact:
            self._load(target.tokenizer_artifact)

    def retain(self, targets: Iterable[Target]) -> None:
        keep = {t.tokenizer_artifact for t in targets}
        with self._lock:
            for artifact in set(self._tokenizers) - keep:
                del self._tokenizers[artifact]

    def _load(self, artifact: str) -> Any:
        with self._lock:
            if artifact in self._tokenizers:
                return self._tokenizers[artifact]
        from transformers import AutoTokenizer

        folder = tokenizer_folder(self.artifact_path(artifact), self.unpack_root)
        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        with self._lock:
            return self._tokenizers.setdefault(artifact, tokenizer)

    def loaded(self, target: Target) -> bool:
        """Counting for ``target`` needs no file read (its tokenizer is loaded, or it has none)."""
        return not target.tokenizer_artifact or target.tokenizer_artifact in self._tokenizers

    def tokenizer(self, target: Target) -> Any:
        """The version's tokenizer (a LoRA adapter's base's), or None when it has no artifact."""
        return self._load(target.tokenizer_artifact) if target.tokenizer_artifact else None

    def chat(self, target: Target, request: dict[str, Any]) -> int | None:
        tokenizer = self.tokenizer(target)
        text = _rendered(tokenizer, request)
        return None if text is None else len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def leading(self, target: Target, route: str, request: dict[str, Any], count: int) -> list[int] | None:
        """The first ``count`` token ids of the prompt as the engine tokenizes it (fewer when it is
        shorter; the first prompt of several), for prefix routing: only a head of the text is tokenized,
        widened until it gives more than ``count`` tokens (the last token of a cut may differ, so it is
        never used)."""
        tokenizer = self.tokenizer(target)
        if tokenizer is None:
            return None
        if ROUTES[route].chat:
            text, special = _rendered(tokenizer, request), False
        else:
            prompt = request.get("prompt")
            first = prompt[0] if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else prompt
            if isinstance(first, list):
                return [int(t) for t in first[:count]]
            text, special = first, True
        if not isinstance(text, str):
            return None
        chars = count * 4
        while True:
            ids = tokenizer(text[:chars], add_special_tokens=special)["input_ids"]
            if chars >= len(text):
                return ids[:count]
            if len(ids) > count:
                return ids[:count]
            chars *= 2

    def prompts(self, target: Target, prompt: Any) -> list[int] | None:
        """The length of each prompt of a completion request (a string, token ids, or lists of them)."""
        tokenizer = self.tokenizer(target)
        if tokenizer is None:
            return None
        items = prompt if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else [prompt]
        return [len(p) if isinstance(p, list) else len(tokenizer(p)["input_ids"]) for p in items]

    def text(self, target: Target, text: str) -> int | None:
        tokenizer = self.tokenizer(target)
        return None if tokenizer is None else len(tokenizer(text, add_special_tokens=False)["input_ids"])

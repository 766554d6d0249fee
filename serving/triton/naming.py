"""Triton model names, shared by the control plane, workers and both Triton flavours.

One function so a worker always asks Triton for exactly the name the repository
writer or the embedded server registered (docs/architecture.md: ``{model}_v{version}``).

Registry model names may hold spaces and any printable character (ClearML names a model
after its training task: ``train sklearn model - sklearn-model``), but a Triton model name
is a directory in the model repository and a segment of Triton's HTTP URLs. A name made of
letters, digits, ``_``, ``.`` and ``-`` keeps its own form; any other name becomes a slug
of it plus a short hash of the whole name, so two names whose slugs agree (``a b`` and
``a_b``) still get two Triton models. A safe name that could be mistaken for such a slug
(it ends like one) is hashed too, so the mapping stays one-to-one.
"""
from __future__ import annotations

import hashlib
import re

TRITON_VERSION = 1  # every registry version is its own Triton model, always at Triton version 1

SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a directory and a URL segment as they are
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_.-]+")
_HASHED = re.compile(r".*--[0-9a-f]{12}")  # the shape of a hashed name: never produced for another name
SLUG_CHARS = 48  # a readable prefix; the hash makes it unique


def triton_base_name(model: str) -> str:
    """A directory- and URL-safe name for a registry model, unique for each model name."""
    if SAFE_NAME.fullmatch(model) and not _HASHED.fullmatch(model):
        return model
    slug = _UNSAFE_RUN.sub("_", model).strip("_.-")[:SLUG_CHARS].rstrip("_.-") or "model"
    digest = hashlib.sha256(model.encode("utf-8")).hexdigest()[:12]
    return f"{slug}--{digest}"


def triton_model_name(model: str, version: int) -> str:
    return f"{triton_base_name(model)}_v{version}"

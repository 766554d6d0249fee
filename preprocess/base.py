"""The interface every preprocessing plug-in offers to the worker's data plane.

Why a protocol and not a base class: a ClearML ``preprocess.py`` must run unchanged,
so user classes are wrapped (``preprocess.user_code``), never made to inherit.
"""
from __future__ import annotations

from typing import Any, Callable, Protocol

Collect = Callable[[dict], None]
"""``collect_custom_statistics_fn``: merge ``{variable: value}`` into the request's statistics."""


class PreprocessError(ValueError):
    """The request body cannot be turned into model input; the client gets a 422 with this message."""


class InputOutOfRange(PreprocessError):
    """A value or length past the model's own limits (vocabulary, positions): a 422 on every protocol."""


class InputTooLarge(PreprocessError):
    """More than an encoder endpoint takes: a text past the model's length when the request asked not to
    truncate, or more texts than one request may carry. A 413, as TEI answers both."""


class UserCodeTimeout(PreprocessError):
    """User code ran past the endpoint's deadline: a 504, and the worker stops waiting for it."""


class Processor(Protocol):
    """One endpoint's preprocessing, shared by all the endpoint's model versions.

    ``preprocess`` may return tensors as a dict ``{input name: array}`` or, as in
    ClearML Serving, a list in the model's input order or a single array; the data
    plane matches them to the chosen version's signature (``preprocess.tensors``).
    ``postprocess`` receives the model outputs in the form ``outputs_form`` names.
    """

    outputs_form: str  # "dict": {name: array}; "clearml": one array, or a list in output order
    has_process: bool  # a custom engine calls ``process``

    async def preprocess(self, body: Any, state: dict, collect: Collect) -> Any: ...

    async def process(self, data: Any, state: dict, collect: Collect) -> Any: ...

    async def postprocess(self, data: Any, state: dict, collect: Collect) -> Any: ...

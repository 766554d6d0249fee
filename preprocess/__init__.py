"""Preprocessing plug-ins: what turns a request body into model tensors and model outputs into an answer.

Every plug-in offers the same three steps as ClearML Serving's ``Preprocess`` class
(``preprocess``, ``process`` for custom engines, ``postprocess``), so the worker's
data plane handles the built-in tokenizer and a user's ``preprocess.py`` alike.
"""
from preprocess.base import Collect, PreprocessError, Processor

__all__ = ["Collect", "PreprocessError", "Processor"]

"""Triton integration: the embedded PyTriton server and the external model-repository writer.

Kept import-light on purpose: the control plane imports ``repository`` without
pulling in pytriton, and the worker only needs ``naming``.
"""
from serving.triton.naming import triton_model_name

__all__ = ["triton_model_name"]

"""Triton integration: the embedded Triton (the ``tritonserver`` binary that nvidia-pytriton ships, with
each model in Triton's own Python backend) and the external model-repository writer.

Kept import-light on purpose: the control plane imports ``repository`` without starting
anything, and the worker only needs ``naming``.
"""
from serving.triton.naming import triton_model_name

__all__ = ["triton_model_name"]

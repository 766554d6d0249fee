"""The FastAPI worker: front ends (``/serve`` REST, Open Inference Protocol v2) over one data plane."""

"""A generation in the worker: the request lifecycle the tensor data plane has, around an engine's
stream (generation.py), with its token accounting, timings, route hints and shadow comparison."""

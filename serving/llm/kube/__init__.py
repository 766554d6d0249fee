"""LLM engines on Kubernetes: the control plane makes a Deployment and a headless Service per engine.

The same engines as on one machine (serving/llm/launch/process.py's ``wanted_engines``: one per model
version and set of launch options, an adapter in its base's), but each is a Deployment whose pods fetch
the model folder from the registry's artifacts in an init container (fetch_model.py) and run vLLM's
OpenAI server. engines.py serves the same ``GET /engines`` map as the one-machine launcher, listing each
engine's pods, so workers route over them as over local replicas.
"""

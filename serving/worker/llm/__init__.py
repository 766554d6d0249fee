"""The worker's LLM path, as a package: routing over an engine's replicas (``routing/``), the replicas
themselves (``replicas.py``). vLLM's ``entrypoints/openai/`` is the layout it follows."""

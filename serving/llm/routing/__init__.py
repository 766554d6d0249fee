"""An LLM engine's replicas as a worker sees them, and the policies that choose one per request.
Nothing is imported here: the registry reads names.py without loading the policies."""

"""The LLM engines a worker relays to, behind one interface (api.py). An engine is a module here that
implements it, and one line in serving/llm/naming.py's ``LLM_ENGINE_FACTORIES`` (the registry's engine
names and the worker's engine registry both read it)."""

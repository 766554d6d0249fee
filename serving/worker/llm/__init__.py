"""The worker's LLM path, as one package laid out as vLLM's ``entrypoints/openai/``: the requests'
shapes (``protocol.py``), the relay to the engine composed with the data plane (``relay.py``, its
timings in ``timing.py``), prompt lengths (``tokens.py``), shadow copies (``shadow.py``), and the
engine's replicas with the policies that pick one (``replicas.py``, ``external.py``, ``routing/``)."""

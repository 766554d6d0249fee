"""LLM endpoints, as one package: each folder is one part of the path a generation takes.

- ``launch/``: the engine processes the control plane runs (`serving llm`): one vLLM OpenAI server per
  model version and options, its replicas, placement, memory budget, replacement and metrics;
- ``engines/``: the interface the relay calls (``api.py``, a Protocol) and the engines implementing it
  (``vllm.py``: an OpenAI-compatible server over HTTP);
- ``relay/``: a generation's lifecycle in the worker: the data plane's request lifecycle around the
  engine's stream, prompt and completion tokens, timings, route hints, shadow comparison;
- ``routing/``: an engine's replicas and the policies that pick one (``names.py`` lists them for the
  registry, below the worker);
- ``openai/``: the OpenAI API: request shapes, the route declarations, the HTTP front end;
- ``adapters/``: LoRA adapters as model versions, and loaded into running engines.

``naming.py`` (engine keys and names), ``checks.py`` (what the registry refuses) and ``folder.py``
(model folders as artifacts) are shared by the control plane and the workers. Layers: the control
plane's parts (``launch/``, ``adapters/``, ``checks.py``, ``naming.py``, ``folder.py``,
``routing/names.py``) never import the worker; the worker's parts import its core (errors, runtime, the
data plane) but never its app or front ends (tests/test_import_graph.py).
"""

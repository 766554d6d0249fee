"""A custom endpoint whose code asks an LLM endpoint, as ClearML's vllm readme shows ``send_request``
used: ``endpoint="chat/completions"`` (or ``"completions"``), the LLM endpoint named in ``data["model"]``."""


class Preprocess:
    def process(self, data, state, collect_custom_statistics_fn=None):
        return self.send_request(endpoint=data["route"], version=None, data=data["request"])

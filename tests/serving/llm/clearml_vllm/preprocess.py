"""A preprocess.py in the shape ClearML Serving's vllm example has (written here, not copied): ``load``
would configure an engine inside the serving process, ``preprocess`` edits the OpenAI request.

Test fixture: ``load`` raises, so an endpoint whose worker called it would fail to load (the platform
must not call it for engine vllm); ``preprocess`` keeps only the last of the leading system messages
and counts how many it dropped as a custom statistic."""


class Preprocess:
    def __init__(self):
        self.model_endpoint = None

    def load(self, local_file_name):
        raise RuntimeError("load() builds an engine in ClearML Serving; the platform must not call it here")

    async def preprocess(self, body, state, collect_custom_statistics_fn=None):
        request = body["request"]
        messages = request.get("messages")
        if messages:
            leading = 0
            while leading < len(messages) and messages[leading]["role"] == "system":
                leading += 1
            if leading > 1:
                request["messages"] = messages[leading - 1:]
            if collect_custom_statistics_fn:
                collect_custom_statistics_fn({"system_dropped": max(0, leading - 1)})
        return body

"""A custom engine: ``load`` gets the model file, ``process`` does the inference; async methods."""
import hashlib


class Preprocess:
    def load(self, local_file_name: str):
        with open(local_file_name, "rb") as f:
            self.digest = hashlib.sha256(f.read()).hexdigest()

    async def preprocess(self, body, state, collect_custom_statistics_fn=None):
        if "x" not in body:
            raise ValueError("body needs x")
        return body["x"]

    async def process(self, data, state, collect_custom_statistics_fn=None):
        collect_custom_statistics_fn({"n": len(data)})
        return sum(data)

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"sum": data, "model": self.digest}

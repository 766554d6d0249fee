"""Fixture for the ``triton`` engine with a picture posted as raw bytes (``Content-Type: image/*``).

The picture is made gray and square at the side the endpoint declared (``--input-size 1 28 28``,
read from ``self.model_endpoint``, which the worker sets before ``load``). Answer: the digit the
network sees, its ten probabilities, and the picture's original size, kept in ``state``.
"""
import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        if not isinstance(body, (bytes, bytearray)):
            raise ValueError("post the picture's bytes with an image Content-Type, not JSON")
        try:
            picture = Image.open(io.BytesIO(body))
            picture.load()
        except (OSError, UnidentifiedImageError):
            raise ValueError("the body is not a picture Pillow can read") from None
        state["size"] = list(picture.size)
        side = self.model_endpoint.input_size[0][-1]
        gray = ImageOps.grayscale(picture.convert("RGB")).resize((side, side))
        return np.asarray(gray, dtype=np.float32)[np.newaxis]

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        probabilities = np.asarray(data, dtype=np.float64).reshape(-1)
        return {"digit": int(probabilities.argmax()), "probabilities": probabilities.tolist(),
                "size": state["size"]}

"""Fixture for the ``triton`` engine taking a picture either way a client may send one: the file's
bytes as the body, or JSON ``{"image": "<the file, base64>"}``.

It returns the 28x28 picture; the endpoint declares a flat input (``--input-size 1 784``), and the
worker fits the array to that shape (same number of values). Answer: the digit.
"""
import base64
import binascii
import io

import numpy as np
from PIL import Image


def picture_bytes(body):
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    try:
        return base64.b64decode(body["image"], validate=True)
    except (KeyError, TypeError, binascii.Error):
        raise ValueError('send the picture as the body, or as JSON {"image": "<base64>"}') from None


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        with Image.open(io.BytesIO(picture_bytes(body))) as picture:
            return np.asarray(picture.convert("L").resize((28, 28)), dtype=np.float32)

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"digit": int(np.argmax(data))}

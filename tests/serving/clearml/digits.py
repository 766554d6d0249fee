"""Handwriting-free digits for the image fixtures: seven-segment numerals drawn with Pillow.

The image endpoints need a picture of a digit and a model that reads it. Both are made here: a
digit is lit segments of a seven-segment display, drawn light on dark (as MNIST-style models
expect) at a jittered place, size and stroke, so a small network trained on a few hundred of them
in a few seconds reads a clean one without fail. Nothing is downloaded.
"""
from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageDraw

SIDE = 28
# Segments: top, upper right, lower right, bottom, lower left, upper left, middle.
LIT = {0: "abcdef", 1: "bc", 2: "abdeg", 3: "abcdg", 4: "bcfg", 5: "acdfg", 6: "acdefg", 7: "abc",
       8: "abcdefg", 9: "abcdfg"}


def _segments(left: float, top: float, width: float, height: float) -> dict[str, tuple[float, float, float, float]]:
    right, bottom, middle = left + width, top + height, top + height / 2
    return {"a": (left, top, right, top), "b": (right, top, right, middle), "c": (right, middle, right, bottom),
            "d": (left, bottom, right, bottom), "e": (left, middle, left, bottom), "f": (left, top, left, middle),
            "g": (left, middle, right, middle)}


def draw(digit: int, left: float = 8, top: float = 5, width: float = 11, height: float = 17,
         stroke: int = 3) -> Image.Image:
    """One digit, grayscale, SIDE x SIDE."""
    image = Image.new("L", (SIDE, SIDE), 0)
    pen = ImageDraw.Draw(image)
    for name, line in _segments(left, top, width, height).items():
        if name in LIT[digit]:
            pen.line(line, fill=255, width=stroke)
    return image


def encoded(digit: int, kind: str = "JPEG") -> bytes:
    """The bytes a client posts: an RGB picture of ``digit`` as a JPEG (or PNG) file."""
    buffer = io.BytesIO()
    draw(digit).convert("RGB").save(buffer, format=kind)
    return buffer.getvalue()


def training_set(per_digit: int = 60, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``per_digit`` jittered drawings of each digit, pixels 0..255 float32 of shape [N, 28, 28]."""
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for digit in LIT:
        for _ in range(per_digit):
            image = draw(digit, left=rng.uniform(5, 10), top=rng.uniform(3, 7), width=rng.uniform(9, 13),
                         height=rng.uniform(14, 19), stroke=int(rng.integers(2, 4)))
            pixels = np.asarray(image, dtype=np.float32) + rng.normal(0, 12, (SIDE, SIDE))
            images.append(np.clip(pixels, 0, 255).astype(np.float32))
            labels.append(digit)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def fit(net, images: np.ndarray, labels: np.ndarray, epochs: int = 40) -> None:
    """Full-batch Adam on the drawings: the set is tiny, so this takes a couple of seconds."""
    import torch

    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    optimiser = torch.optim.Adam(net.parameters(), lr=0.01)
    net.train()
    for _ in range(epochs):
        optimiser.zero_grad()
        loss = torch.nn.functional.nll_loss(torch.log(net(x) + 1e-9), y)
        loss.backward()
        optimiser.step()
    net.eval()

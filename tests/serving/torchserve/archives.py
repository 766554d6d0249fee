"""TorchServe model archives (``.mar``) of every kind TorchServe users have, built by TorchServe's own
``torch-model-archiver`` from tiny models, handlers and inputs written here.

Why our own: the serving side must answer each archive exactly as real TorchServe does, so the tests
need archives whose every part is known and reproducible: random weights from a fixed seed, inputs
drawn with Pillow, no download. Each ``build_<kind>(dest)`` writes its sources under ``dest/<kind>/``,
archives them into ``dest/<name>.mar`` and returns an :class:`Archive`: the path, the model name, the
sample inputs a test sends, and the registration settings the kind needs. :func:`build_archives`
builds several (two archiver processes at a time); :func:`session_archives` builds all once per test
session (they are deterministic, so one build serves every test).

The handler sources are strings below, each its own file in the archive; TorchServe imports a
handler by module name, so every module name is distinct from the platform's own packages.
"""
from __future__ import annotations

import io
import json
import runpy
import subprocess
import sys
import textwrap
import threading
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image, ImageDraw

__all__ = ["Archive", "KINDS", "IMAGE_KINDS", "CLASSIFIER_LABELS", "SLOW_TIMEOUT_S", "build_archives",
           "session_archives", "archiver_command", "digit_png", "color_image", "text_vocab"] + [
    f"build_{kind}" for kind in (
        "mnist", "image_classifier", "image_segmenter", "object_detector", "text_classifier", "base_handler",
        "subclass", "function", "batched", "slow", "requirements", "metrics")]

_TORCH_RNG = threading.Lock()  # archives build in threads; each seeds torch's global generator
IMAGE_KINDS = ("mnist", "image_classifier", "image_segmenter", "object_detector")  # their handlers import torchvision


@dataclass(frozen=True)
class Archive:
    """One built archive: what a test registers and sends."""

    kind: str
    name: str  # the model name in its MANIFEST (and the .mar's stem)
    mar: Path
    inputs: dict[str, Any] = field(default_factory=dict)  # named sample inputs: bytes (images, text) or JSON values
    register: dict[str, Any] = field(default_factory=dict)  # TorchServe.register keyword arguments the kind needs
    notes: str = ""


def archiver_command() -> list[str]:
    """TorchServe's archiver CLI of the running interpreter's environment."""
    script = Path(sys.executable).parent / "torch-model-archiver"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "model_archiver.model_packaging"]


def _archive(dest: Path, name: str, handler: Path | str, *, serialized: Path | None = None,
             model_file: Path | None = None, extra_files: Sequence[Path] = (), config_file: Path | None = None,
             requirements: Path | None = None) -> Path:
    """Run ``torch-model-archiver`` and return the .mar it wrote into ``dest``."""
    command = archiver_command() + ["--model-name", name, "--version", "1.0", "--handler", str(handler),
                                    "--export-path", str(dest), "--force"]
    optional = {"--serialized-file": serialized, "--model-file": model_file, "--config-file": config_file,
                "--requirements-file": requirements}
    for flag, value in optional.items():
        if value is not None:
            command += [flag, str(value)]
    if extra_files:
        command += ["--extra-files", ",".join(str(path) for path in extra_files)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"torch-model-archiver failed ({done.returncode}): {' '.join(command)}\n"
                           f"{done.stdout}\n{done.stderr}")
    mar = dest / f"{name}.mar"
    assert mar.is_file(), f"torch-model-archiver wrote no {mar}"
    return mar


def _write(folder: Path, filename: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(textwrap.dedent(text))
    return path


def _load_class(path: Path, name: str) -> type[torch.nn.Module]:
    """A model class from its source file, as TorchServe will import it (the file is the archive's)."""
    return runpy.run_path(str(path))[name]


def _seeded(seed: int, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """``make()`` with torch's global generator seeded (random weights, the same on every build)."""
    with _TORCH_RNG:
        torch.manual_seed(seed)
        return make()


def _save_state_dict(model: torch.nn.Module, path: Path) -> Path:
    torch.save(model.state_dict(), path)
    return path


def _save_script(model: torch.nn.Module, path: Path) -> Path:
    """A TorchScript file, the form TorchServe's BaseHandler loads without a model file. torch 2.10+
    calls torch.jit.script deprecated; TorchServe 0.12 still loads this form, so the warning is noise."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=DeprecationWarning)
        torch.jit.script(model.eval()).save(str(path))
    return path


def _json_file(folder: Path, filename: str, value: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / filename
    path.write_text(json.dumps(value, indent=1))
    return path


# ---------------------------------------------------------------------------------------------- images


def _encode(image: Image.Image, fmt: str) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def digit_png(digit: int) -> bytes:
    """A 28x28 grayscale PNG of a digit drawn with strokes (no font: the same pixels everywhere)."""
    image = Image.new("L", (28, 28), 0)
    draw = ImageDraw.Draw(image)
    strokes = {
        0: lambda: draw.ellipse((8, 5, 20, 23), outline=255, width=3),
        1: lambda: draw.line((14, 4, 14, 24), fill=255, width=3),
        3: lambda: (draw.arc((8, 4, 20, 14), 270, 180, fill=255, width=3),
                    draw.arc((8, 13, 20, 24), 180, 90, fill=255, width=3)),
        7: lambda: (draw.line((7, 5, 21, 5), fill=255, width=3), draw.line((21, 5, 11, 24), fill=255, width=3)),
    }
    strokes[digit]()
    return _encode(image, "PNG")


def color_image(width: int, height: int, seed: int, fmt: str) -> bytes:
    """An RGB picture: seeded noise under a few filled shapes, so that image models see structure."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 96, size=(height, width, 3), dtype=np.uint8)
    image = Image.fromarray(pixels, "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(3):
        x0, y0 = int(rng.integers(0, width // 2)), int(rng.integers(0, height // 2))
        x1, y1 = x0 + int(rng.integers(width // 4, width // 2)), y0 + int(rng.integers(height // 4, height // 2))
        fill = tuple(int(v) for v in rng.integers(64, 256, size=3))
        (draw.ellipse if rng.integers(2) else draw.rectangle)((x0, y0, x1, y1), fill=fill)
    return _encode(image, fmt)


# ----------------------------------------------------------------------------------------------- mnist

MNIST_MODEL = '''\
    """A small convolutional digit classifier over 1x28x28 images (log-probabilities of 10 digits)."""
    import torch
    from torch import nn


    class DigitNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(1, 4, kernel_size=3), nn.ReLU(), nn.MaxPool2d(2),
                nn.Conv2d(4, 8, kernel_size=3), nn.ReLU(), nn.MaxPool2d(2),
            )
            self.head = nn.Linear(8 * 5 * 5, 10)

        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(self.head(self.features(images).flatten(1)), dim=1)
'''

MNIST_HANDLER = '''\
    """Digits from 28x28 grayscale images: TorchServe's ImageClassifier with our own transform, and the
    predicted digit (an int) as each image's answer."""
    from torchvision import transforms

    from ts.torch_handler.image_classifier import ImageClassifier


    class DigitHandler(ImageClassifier):
        image_processing = transforms.Compose([
            transforms.ToTensor(),
            transforms.Normalize((0.5,), (0.25,)),
        ])

        def postprocess(self, data):
            return data.argmax(dim=1).tolist()
'''


def build_mnist(dest: Path) -> Archive:
    """Eager model (``--model-file`` + state dict) and an ``ImageClassifier`` subclass, as TorchServe's
    own MNIST example is shaped."""
    src = dest / "mnist"
    model_file = _write(src, "digit_net.py", MNIST_MODEL)
    handler = _write(src, "digit_handler.py", MNIST_HANDLER)
    weights = _save_state_dict(_seeded(1, _load_class(model_file, "DigitNet")), src / "digit_net.pth")
    mar = _archive(dest, "mnist", handler, serialized=weights, model_file=model_file)
    inputs = {f"digit_{d}": digit_png(d) for d in (0, 1, 3, 7)}
    return Archive("mnist", "mnist", mar, inputs, notes="answer per image: an int (the argmax digit)")


# ------------------------------------------------------------------------------------ image_classifier

class TinyClassifier(torch.nn.Module):
    """Ten classes from a 3-channel image of any size (TorchScript: the archive holds no model file)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 6, kernel_size=7, stride=4)
        self.pool = torch.nn.AdaptiveAvgPool2d(1)
        self.head = torch.nn.Linear(6, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(torch.relu(self.conv(images))).flatten(1))


# ImageNet's file maps an index to [synset id, name]; TorchServe takes a list's last item. Both forms here.
CLASSIFIER_LABELS = {"0": ["n0000", "ant"], "1": ["n0001", "bee"], "2": "cat", "3": "dog", "4": ["n0004", "eel"],
                     "5": "fox", "6": "gnu", "7": ["n0007", "hen"], "8": "ibis", "9": "jay"}


def build_image_classifier(dest: Path) -> Archive:
    """TorchScript CNN with the built-in ``image_classifier`` handler and ``index_to_name.json``:
    answers are top-5 ``{class name: probability}`` dicts."""
    src = dest / "image_classifier"
    src.mkdir(parents=True, exist_ok=True)
    weights = _save_script(_seeded(2, TinyClassifier), src / "tiny_classifier.pt")
    labels = _json_file(src, "index_to_name.json", CLASSIFIER_LABELS)
    mar = _archive(dest, "image_classifier", "image_classifier", serialized=weights, extra_files=[labels])
    inputs = {"jpeg": color_image(96, 72, seed=21, fmt="JPEG"), "png": color_image(64, 80, seed=22, fmt="PNG")}
    return Archive("image_classifier", "image_classifier", mar, inputs,
                   notes="answer per image: {label: probability} of the top 5, highest first")


# ------------------------------------------------------------------------------------- image_segmenter

class TinySegmenter(torch.nn.Module):
    """Four classes per 16x16 patch, returned as torchvision's segmentation models do: ``{"out": N,K,H,W}``."""

    def __init__(self) -> None:
        super().__init__()
        self.head = torch.nn.Conv2d(3, 4, kernel_size=16, stride=16)

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.head(images)}


def build_image_segmenter(dest: Path) -> Archive:
    """TorchScript segmenter with the built-in ``image_segmenter`` handler: per image, a 14x14 grid (224
    pixels / 16) of ``[class index, probability]``."""
    src = dest / "image_segmenter"
    src.mkdir(parents=True, exist_ok=True)
    weights = _save_script(_seeded(3, TinySegmenter), src / "tiny_segmenter.pt")
    mar = _archive(dest, "image_segmenter", "image_segmenter", serialized=weights)
    inputs = {"jpeg": color_image(80, 60, seed=31, fmt="JPEG")}
    return Archive("image_segmenter", "image_segmenter", mar, inputs,
                   notes="answer per image: 14x14 list of [class index (float), probability]")


# ------------------------------------------------------------------------------------- object_detector

DETECTOR_MODEL = '''\
    """A detection-shaped model: each image split into a 2x2 grid of candidate boxes, each scored and
    labelled from its pooled features; the output is torchvision's (a dict of boxes, labels, scores
    per image)."""
    import torch
    from torch import nn


    class GridDetector(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Conv2d(3, 8, kernel_size=3, padding=1)
            self.objectness = nn.Linear(8, 1)
            self.classes = nn.Linear(8, 3)

        def forward(self, images: torch.Tensor) -> list:
            _, _, height, width = images.shape
            cells = nn.functional.adaptive_avg_pool2d(torch.relu(self.features(images)), 2)
            cells = cells.flatten(2).transpose(1, 2)  # N x 4 cells x 8 features, row-major
            scores = torch.sigmoid(self.objectness(cells)).squeeze(-1)
            labels = self.classes(cells).argmax(dim=-1) + 1  # 0 is the background, as in torchvision
            half_w, half_h = width / 2, height / 2
            boxes = torch.tensor([[col * half_w, row * half_h, (col + 1) * half_w, (row + 1) * half_h]
                                  for row in range(2) for col in range(2)])
            return [{"boxes": boxes, "labels": labels[i], "scores": scores[i]} for i in range(images.shape[0])]
'''

DETECTOR_LABELS = {"0": "background", "1": "circle", "2": "square", "3": "triangle"}


def _calibrate_objectness(detector: torch.nn.Module, png: bytes) -> None:
    """Sharpen the heads and shift the objectness bias so that the sample image's cells straddle the
    handler's 0.5 threshold (two boxes kept, two dropped) with distinct labels: random weights alone
    score every cell near 0.5 with one label, which would test little."""
    pixels = torch.from_numpy(np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float32) / 255.0)
    with torch.no_grad():
        cells = torch.nn.functional.adaptive_avg_pool2d(torch.relu(detector.features(pixels.permute(2, 0, 1)[None])), 2)
        cells = cells.flatten(2).transpose(1, 2)[0]  # 4 cells x 8 features
        for head in (detector.objectness, detector.classes):
            head.weight *= 40.0
            head.bias.copy_(-(cells.mean(dim=0) @ head.weight.T))  # a cell of mean features scores 0
        logits = detector.objectness(cells).flatten().sort().values
        detector.objectness.bias -= (logits[1] + logits[2]) / 2


def build_object_detector(dest: Path) -> Archive:
    """Eager detector (model file + state dict) with the built-in ``object_detector`` handler and
    ``index_to_name.json``: per image, a list of ``{label: box, "score": s}`` over the 0.5 threshold."""
    src = dest / "object_detector"
    model_file = _write(src, "grid_detector.py", DETECTOR_MODEL)
    detector = _seeded(4, _load_class(model_file, "GridDetector"))
    inputs = {"png": color_image(64, 48, seed=41, fmt="PNG")}
    _calibrate_objectness(detector, inputs["png"])
    weights = _save_state_dict(detector, src / "grid_detector.pth")
    labels = _json_file(src, "index_to_name.json", DETECTOR_LABELS)
    mar = _archive(dest, "object_detector", "object_detector", serialized=weights, model_file=model_file,
                   extra_files=[labels])
    return Archive("object_detector", "object_detector", mar, inputs,
                   notes="answer per image: list of {label: [x0, y0, x1, y1], 'score': s} with s >= 0.5")


# ------------------------------------------------------------------------------------- text_classifier

TEXT_MODEL = '''\
    """Mean of token and bigram embeddings, then a linear layer: the (text, offsets) model shape that
    TorchServe's text_classifier handler calls (its ``embedding`` attribute is what Captum explains)."""
    import torch
    from torch import nn

    VOCAB_SIZE = 64


    class NgramBag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embedding = nn.EmbeddingBag(VOCAB_SIZE, 8, mode="mean")
            self.fc = nn.Linear(8, 4)

        def forward(self, text: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
            return self.fc(self.embedding(text, offsets))
'''

TEXT_CORPUS = ("the movie was great and the actors were good", "i did not like the ending at all",
               "what a boring film", "is this the best film of the year")
TEXT_LABELS = {"0": "negative", "1": "neutral", "2": "positive", "3": "question"}


def text_vocab() -> Counter:
    """Token and bigram -> index, index 0 for any other (a ``Counter`` answers 0 for a missing key, and
    ``torch.load`` takes one with ``weights_only=True``, its default since torch 2.6)."""
    vocab: Counter = Counter()
    for line in TEXT_CORPUS:
        words = line.split()
        for entry in words + [f"{a} {b}" for a, b in zip(words, words[1:])]:
            if entry not in vocab:
                vocab[entry] = len(vocab) + 1
    assert len(vocab) < 64
    return vocab


def build_text_classifier(dest: Path) -> Archive:
    """Eager (text, offsets) model with the built-in ``text_classifier`` handler, ``source_vocab.pt`` and
    ``index_to_name.json`` (no torchtext). The handler reads only a batch's first request."""
    src = dest / "text_classifier"
    model_file = _write(src, "ngram_bag.py", TEXT_MODEL)
    weights = _save_state_dict(_seeded(5, _load_class(model_file, "NgramBag")), src / "ngram_bag.pth")
    vocab = src / "source_vocab.pt"
    torch.save(text_vocab(), vocab)
    labels = _json_file(src, "index_to_name.json", TEXT_LABELS)
    mar = _archive(dest, "text_classifier", "text_classifier", serialized=weights, model_file=model_file,
                   extra_files=[vocab, labels])
    inputs = {"review": "The movie wasn't great, but the <b>actors</b> were good!".encode(),
              "question": "Is this the best film?".encode(), "unknown_words": "Zebras quietly juggle".encode()}
    return Archive("text_classifier", "text_classifier", mar, inputs,
                   notes="answer: {label: probability} over all 4 labels; batch size must be 1")


# ---------------------------------------------------------------------------------------- base_handler

class Affine(torch.nn.Module):
    """Three numbers in, two out (TorchScript)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return self.linear(values)


def build_base_handler(dest: Path) -> Archive:
    """TorchScript model with the built-in ``base_handler``. Its ``preprocess`` is
    ``torch.as_tensor(data)`` over the request rows, which are dicts (``{"body": ...}``): without a
    service envelope every request fails in the handler; with ``service_envelope=body`` the rows are the
    bodies, so a JSON body ``[1, 2, 3]`` is one row of the model's input."""
    src = dest / "base_handler"
    src.mkdir(parents=True, exist_ok=True)
    weights = _save_script(_seeded(6, Affine), src / "affine.pt")
    mar = _archive(dest, "base_handler", "base_handler", serialized=weights)
    inputs = {"row": [1.0, 2.0, 3.0], "rows": [[1.0, 2.0, 3.0], [0.5, 0.0, -1.0]]}
    return Archive("base_handler", "base_handler", mar, inputs,
                   notes="answer: model(torch.as_tensor(body)).tolist(); fails without service_envelope=body")


# -------------------------------------------------------------------------------------------- subclass

SUBCLASS_HANDLER = '''\
    """Our own BaseHandler subclass: JSON ``{"values": [3 numbers]}`` in, one JSON object per request
    out, scored by the archive's TorchScript model (loaded by BaseHandler.initialize)."""
    import json

    import torch

    from ts.torch_handler.base_handler import BaseHandler


    class ValuesHandler(BaseHandler):
        def preprocess(self, data):
            rows = []
            for row in data:
                body = row.get("data") or row.get("body")
                if isinstance(body, (bytes, bytearray)):
                    body = body.decode("utf-8")
                if isinstance(body, str):
                    body = json.loads(body)
                rows.append([float(v) for v in body["values"]])
            return torch.tensor(rows, dtype=torch.float32)

        def postprocess(self, data):
            return [{"scores": [round(v, 6) for v in row], "best": int(max(range(len(row)), key=row.__getitem__))}
                    for row in data.tolist()]
'''


def build_subclass(dest: Path) -> Archive:
    """A ``BaseHandler`` subclass of ours over a TorchScript model: JSON in, a JSON object per request."""
    src = dest / "subclass"
    handler = _write(src, "values_handler.py", SUBCLASS_HANDLER)
    weights = _save_script(_seeded(7, Affine), src / "values_model.pt")
    mar = _archive(dest, "subclass", handler, serialized=weights)
    return Archive("subclass", "subclass", mar, {"values": {"values": [0.5, -1.0, 2.0]}},
                   notes='answer: {"scores": [2 floats], "best": index}')


# -------------------------------------------------------------------------------------------- function

FUNCTION_HANDLER = '''\
    """TorchServe's function form of a handler: ``handle(data, context)``, called once with ``data=None``
    when the worker loads the model. It answers, for each request, what TorchServe handed it: each
    field's name, Python type and value (bytes as base64), the request's content types and header
    names, and the two headers TorchServe adds (url_path, explain)."""
    import base64

    _loaded = {}


    def _describe(value):
        if isinstance(value, (bytes, bytearray)):
            return {"type": type(value).__name__, "base64": base64.b64encode(bytes(value)).decode("ascii")}
        return {"type": type(value).__name__, "value": value}


    def handle(data, context):
        if data is None:
            _loaded["model"] = context.manifest["model"]["modelName"]
            return None
        answers = []
        for idx, row in enumerate(data):
            headers = context.get_all_request_header(idx)
            answers.append({
                "model": _loaded["model"],
                "batch_size": len(data),
                "fields": {name: _describe(value) for name, value in row.items()},
                "field_content_types": {name: headers.get(name, {}).get("content-type") for name in row},
                "request_content_type": headers.get("Content-Type", headers.get("content-type")),
                "header_names": sorted(k for k, v in headers.items() if isinstance(v, str)),
                "url_path": headers.get("url_path"),
                "explain": headers.get("explain"),
            })
        return answers
'''


def build_function(dest: Path) -> Archive:
    """A module-level ``handle(data, context)`` that echoes what it was given (no model file)."""
    src = dest / "function"
    handler = _write(src, "echo_handler.py", FUNCTION_HANDLER)
    mar = _archive(dest, "function", handler)
    return Archive("function", "function", mar, {"text": b"hello torchserve", "json": {"a": 1, "b": [1, 2]},
                                                 "png": digit_png(7)},
                   notes="answer: a description of the request TorchServe handed the handler")


# --------------------------------------------------------------------------------------------- batched

BATCHED_HANDLER = '''\
    """Answers each request with its value scaled by ``handler.scale`` of model-config.yaml (read through
    ``context.model_yaml_config``) and the size of the batch it was computed in. A request
    ``{"fail": true}`` makes the whole call raise: how TorchServe answers the batch is what tests check."""
    import json


    class BatchProbe:
        def __init__(self):
            self.scale = None
            self.initialized = False

        def initialize(self, context):
            self.scale = context.model_yaml_config["handler"]["scale"]
            self.initialized = True

        def handle(self, data, context):
            bodies = []
            for row in data:
                body = row.get("data") or row.get("body")
                if isinstance(body, (bytes, bytearray)):
                    body = json.loads(body.decode("utf-8"))
                bodies.append(body)
            if any(isinstance(body, dict) and body.get("fail") for body in bodies):
                raise ValueError("a poison request is in this batch")
            return [{"value": body["value"], "scaled": body["value"] * self.scale, "batch_size": len(data)}
                    for body in bodies]
'''

BATCHED_CONFIG = '''\
    # TorchServe model config: batch up to 4 requests, waiting at most 200 ms for them
    batchSize: 4
    maxBatchDelay: 200
    responseTimeout: 5
    minWorkers: 1
    maxWorkers: 1
    handler:
      scale: 3
'''


def build_batched(dest: Path) -> Archive:
    """Batching set by the archive's ``model-config.yaml`` (``--config-file``): batchSize 4, maxBatchDelay
    200 ms, responseTimeout 5 s, and a custom ``handler.scale`` the handler reads."""
    src = dest / "batched"
    handler = _write(src, "batch_probe.py", BATCHED_HANDLER)
    config = _write(src, "model-config.yaml", BATCHED_CONFIG)
    mar = _archive(dest, "batched", handler, config_file=config)
    return Archive("batched", "batched", mar, {"value": {"value": 2}, "poison": {"fail": True}},
                   notes='answer: {"value": v, "scaled": 3 v, "batch_size": n}')


# ------------------------------------------------------------------------------------------------ slow

SLOW_HANDLER = '''\
    """Sleeps ``{"sleep": seconds}`` before answering: longer than the model's responseTimeout, it makes
    TorchServe time the request out."""
    import json
    import time


    def handle(data, context):
        if data is None:
            return None
        answers = []
        for row in data:
            body = row.get("data") or row.get("body")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body.decode("utf-8"))
            time.sleep(float(body.get("sleep", 0)))
            answers.append({"slept": body.get("sleep", 0)})
        return answers
'''

SLOW_TIMEOUT_S = 2
SLOW_CONFIG = f'''\
    # a short response timeout, so that a test waits little for TorchServe to give up on a request
    responseTimeout: {SLOW_TIMEOUT_S}
'''


def build_slow(dest: Path) -> Archive:
    """A handler that sleeps as long as asked, with ``responseTimeout: 2`` in its model-config.yaml."""
    src = dest / "slow"
    handler = _write(src, "sleepy.py", SLOW_HANDLER)
    config = _write(src, "model-config.yaml", SLOW_CONFIG)
    mar = _archive(dest, "slow", handler, config_file=config)
    return Archive("slow", "slow", mar, {"fast": {"sleep": 0}, "too_slow": {"sleep": SLOW_TIMEOUT_S + 3}},
                   notes=f"responseTimeout {SLOW_TIMEOUT_S} s")


# ---------------------------------------------------------------------------------------- requirements

REQUIREMENTS_HANDLER = '''\
    """Imports its requirement (``packaging``, from the archive's requirements.txt) and uses it."""
    from packaging.version import Version


    def handle(data, context):
        if data is None:
            return None
        return [{"newer": str(max(Version("1.2"), Version("1.10")))} for _ in data]
'''


def build_requirements(dest: Path) -> Archive:
    """An archive with ``--requirements-file``: a requirement already installed here (the machine has no
    internet), which TorchServe installs only with install_py_dep_per_model=true."""
    src = dest / "requirements"
    handler = _write(src, "needs_packaging.py", REQUIREMENTS_HANDLER)
    requirements = _write(src, "requirements.txt", "packaging>=20\n")
    mar = _archive(dest, "requirements", handler, requirements=requirements)
    return Archive("requirements", "requirements", mar, {"any": {"x": 1}}, notes='answer: {"newer": "1.10"}')


# --------------------------------------------------------------------------------------------- metrics

METRICS_HANDLER = '''\
    """Adds custom metrics through ``context.metrics``: a counter with a dimension of its own, a time,
    and a gauge made with ``add_metric_to_cache`` and updated with ``add_or_update``."""
    from ts.metrics.dimension import Dimension
    from ts.metrics.metric_type_enum import MetricTypes


    def handle(data, context):
        if data is None:
            return None
        metrics = context.metrics
        metrics.add_counter("ProbeRequests", len(data), None, [Dimension("Probe", "metrics")])
        metrics.add_time("ProbeWorkTime", 1.5, None, "ms")
        gauge = metrics.add_metric_to_cache("ProbeBatchSize", "count", ["ModelName"], MetricTypes.GAUGE)
        gauge.add_or_update(len(data), [context.model_name])
        return [{"counted": len(data)} for _ in data]
'''


def build_metrics(dest: Path) -> Archive:
    """A handler adding custom metrics (counter ProbeRequests, time ProbeWorkTime, gauge ProbeBatchSize)."""
    src = dest / "metrics"
    handler = _write(src, "probe_metrics.py", METRICS_HANDLER)
    mar = _archive(dest, "metrics", handler)
    return Archive("metrics", "metrics", mar, {"any": {"x": 1}}, notes='answer: {"counted": batch size}')


# ------------------------------------------------------------------------------------------- all kinds

KINDS: dict[str, Callable[[Path], Archive]] = {
    "mnist": build_mnist, "image_classifier": build_image_classifier, "image_segmenter": build_image_segmenter,
    "object_detector": build_object_detector, "text_classifier": build_text_classifier,
    "base_handler": build_base_handler, "subclass": build_subclass, "function": build_function,
    "batched": build_batched, "slow": build_slow, "requirements": build_requirements, "metrics": build_metrics,
}


def build_archives(dest: Path, kinds: list[str] | None = None, parallel: int = 2) -> dict[str, Archive]:
    """Build archives of ``kinds`` (all by default) into ``dest``; two archiver processes at a time."""
    dest.mkdir(parents=True, exist_ok=True)
    wanted = list(kinds or KINDS)
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        built = list(pool.map(lambda kind: KINDS[kind](dest), wanted))
    return {archive.kind: archive for archive in built}


_session: dict[str, Archive] = {}


def session_archives(tmp_path_factory: Any) -> dict[str, Archive]:
    """All archives, built once per test session into a folder of ``tmp_path_factory`` (pytest's)."""
    if not _session or not all(archive.mar.is_file() for archive in _session.values()):
        _session.clear()
        _session.update(build_archives(tmp_path_factory.mktemp("torchserve-archives")))
    return dict(_session)


"""The TorchServe benchmark's archives and inputs, built with TorchServe's own ``torch-model-archiver``.

Two workloads of the shapes TorchServe users serve on CPUs:

- ``resnet18``: TorchServe's built-in ``image_classifier`` handler over a ResNet-18 as TorchScript
  (torchvision's architecture, random weights from a fixed seed: no download), 1,000 classes named in
  ``index_to_name.json``; JPEG photos of three sizes, which the handler decodes, resizes to 256 and
  crops to 224. Answers: the top 5 ``{class name: probability}``. Here the model's 1.8 GFLOPs dominate.
- ``mnist``: the test suite's MNIST-shaped archive (tests/serving/torchserve/archives.py ``build_mnist``:
  an eager model file + state dict, an ``ImageClassifier`` subclass), 28x28 PNG digits. The model
  costs microseconds, so this one measures the serving path around the handler.

The archives are deterministic (seeded weights, drawn inputs), so they are built once into
``benchmarks/.cache/torchserve`` and reused; :data:`VERSION` names the build.
"""
from __future__ import annotations

import io
import json
import subprocess
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CACHE = Path(__file__).resolve().parent / ".cache" / "torchserve"
VERSION = "1"  # bump when an archive or input changes: the cache is rebuilt under a new folder
RESNET_SEED = 18
# width x height of the photos sent to the classifier: a thumbnail, a phone's preview and a larger one
PHOTO_SIZES = ((320, 240), (640, 480), (1024, 768))
CLASSES = 1000
_BUILD_LOCK = threading.Lock()


@dataclass(frozen=True)
class Workload:
    """An archive and the request bodies every system gets (in this order, in a ring)."""

    name: str
    mar: Path
    inputs: dict[str, bytes]
    notes: str = ""
    model_file: Path | None = None  # the model inside the archive (TorchScript or state dict), for the ceiling
    details: dict = field(default_factory=dict)

    def write_inputs(self, folder: Path) -> list[Path]:
        """The inputs as files (what wrk reads and ``curl -T`` would send), in order."""
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for name, body in self.inputs.items():
            path = folder / name
            path.write_bytes(body)
            paths.append(path)
        return paths


def archiver_command() -> list[str]:
    """The archiver of the running interpreter's environment (the ``torchserve`` extra installs it)."""
    import sys

    script = Path(sys.executable).parent / "torch-model-archiver"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "model_archiver.model_packaging"]


def archive(dest: Path, name: str, handler: str, serialized: Path, extra_files: list[Path]) -> Path:
    """``torch-model-archiver`` as a TorchServe user runs it; the ``.mar`` it wrote."""
    command = archiver_command() + ["--model-name", name, "--version", "1.0", "--handler", handler,
                                    "--serialized-file", str(serialized), "--export-path", str(dest), "--force"]
    if extra_files:
        command += ["--extra-files", ",".join(map(str, extra_files))]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"torch-model-archiver failed: {' '.join(command)}\n{done.stdout}\n{done.stderr}")
    return dest / f"{name}.mar"


def photo_jpeg(width: int, height: int, seed: int) -> bytes:
    """A photo-like JPEG: smooth gradients, a few soft shapes and mild sensor noise (pure noise would
    compress like no photo does and make decoding the benchmark)."""
    from PIL import Image, ImageDraw, ImageFilter

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack([(x / width) * rng.uniform(80, 200), (y / height) * rng.uniform(80, 200),
                     ((x + y) / (width + height)) * rng.uniform(60, 160)], axis=-1)
    image = Image.fromarray(base.clip(0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        x0, y0 = int(rng.integers(0, width)), int(rng.integers(0, height))
        size = int(rng.integers(min(width, height) // 8, min(width, height) // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.integers(2) else draw.rectangle)((x0, y0, x0 + size, y0 + size), fill=fill)
    image = image.filter(ImageFilter.GaussianBlur(2))
    noisy = np.asarray(image, dtype=np.int16) + rng.integers(-6, 7, size=(height, width, 3))
    out = io.BytesIO()
    Image.fromarray(noisy.clip(0, 255).astype(np.uint8), "RGB").save(out, format="JPEG", quality=90)
    return out.getvalue()


def _scripted_resnet(path: Path) -> Path:
    """torchvision's ResNet-18 with seeded random weights, as TorchScript (what the built-in handler
    loads without a model file). torch 2.10+ calls torch.jit.script deprecated; TorchServe 0.12 loads it."""
    import torch
    import torchvision

    torch.manual_seed(RESNET_SEED)
    model = torchvision.models.resnet18(weights=None).eval()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.jit.script(model).save(str(path))
    return path


def build_resnet(dest: Path) -> Workload:
    src = dest / "resnet18-src"
    src.mkdir(parents=True, exist_ok=True)
    weights = _scripted_resnet(src / "resnet18.pt")
    labels = src / "index_to_name.json"
    labels.write_text(json.dumps({str(i): [f"n{i:08d}", f"class_{i}"] for i in range(CLASSES)}))
    mar = archive(dest, "resnet18", "image_classifier", weights, [labels])
    inputs = {f"photo_{w}x{h}_{seed}.jpg": photo_jpeg(w, h, seed)
              for seed, (w, h) in enumerate(PHOTO_SIZES * 2, start=100)}
    return Workload("resnet18", mar, inputs, model_file=weights,
                    notes="built-in image_classifier handler, ResNet-18 TorchScript (random seeded weights), "
                          f"JPEG photos {', '.join(f'{w}x{h}' for w, h in PHOTO_SIZES)}",
                    details={"input_bytes": {name: len(body) for name, body in inputs.items()}})


def build_digits(dest: Path) -> Workload:
    from tests.serving.torchserve.archives import build_mnist

    built = build_mnist(dest)
    inputs = {f"{name}.png": body for name, body in built.inputs.items()}
    return Workload("mnist", built.mar, inputs, model_file=dest / "mnist" / "digit_net.pth",
                    notes="ImageClassifier subclass (tests/serving/torchserve/archives.py build_mnist), eager "
                          "model file + state dict, 28x28 PNG digits",
                    details={"input_bytes": {name: len(body) for name, body in inputs.items()}})


BUILDERS = {"resnet18": build_resnet, "mnist": build_digits}


def workload(name: str) -> Workload:
    """The workload, built on first use and cached (the build is deterministic)."""
    dest = CACHE / f"v{VERSION}"
    marker = dest / f"{name}.json"
    with _BUILD_LOCK:
        if marker.is_file():
            data = json.loads(marker.read_text())
            inputs = {n: (dest / "inputs" / name / n).read_bytes() for n in data["inputs"]}
            return Workload(name, Path(data["mar"]), inputs, data["notes"],
                            Path(data["model_file"]) if data.get("model_file") else None, data["details"])
        dest.mkdir(parents=True, exist_ok=True)
        built = BUILDERS[name](dest)
        built.write_inputs(dest / "inputs" / name)
        marker.write_text(json.dumps({"mar": str(built.mar), "inputs": list(built.inputs), "notes": built.notes,
                                      "model_file": str(built.model_file) if built.model_file else None,
                                      "details": built.details}))
        return built

"""Infinity (``infinity-emb`` on PyPI, michaelfeil/infinity), in a venv of its own, as its users run it:
``infinity_emb v2 --model-id FOLDER --engine optimum`` on the same MiniLM-L6 folder (its best CPU engine:
ONNX through Optimum), answering OpenAI's ``/embeddings``.

The venv (``benchmarks/.venv-infinity``) is created on first use, never by ``make setup``: only this
benchmark needs it (about 2 minutes, 1.5 GB: Infinity pins its own transformers, sentence-transformers
and Optimum, which the project's venv must not follow). ``--infinity-python`` or
``SERVING_INFINITY_PYTHON`` points at an existing one instead.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from benchmarks.procs import REPO

VERSION = "0.0.78"
VENV = REPO / "benchmarks" / ".venv-infinity"
# torch: the CPU build the project's venv uses (scripts/setup.sh), not the CUDA one pip would pick
PACKAGES = (f"infinity-emb[server,optimum,torch]=={VERSION}", "torch==2.13.0+cpu")


def python() -> Path:
    """Infinity's interpreter, its venv made first when missing."""
    given = os.environ.get("SERVING_INFINITY_PYTHON")
    if given:
        return Path(given)
    exe = VENV / "bin" / "python"
    if not (VENV / ".installed").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run([str(exe), "-m", "pip", "install", "-q", *PACKAGES], check=True)
        (VENV / ".installed").write_text(" ".join(PACKAGES))
    return exe


def command(model: Path, port: int, name: str, batch_size: int = 32, pooling: str = "mean") -> list[str]:
    """Infinity's server on ``model`` (a sentence-transformers folder), ONNX engine, OpenAI routes. The
    pooling is named: the optimum engine's ``auto`` pools with the CLS token whatever the folder says
    (all-MiniLM-L6-v2 pools the mean; its answers were 0.44 in cosine from the model's without it)."""
    cli = python().parent / "infinity_emb"
    return [str(cli), "v2", "--model-id", str(model), "--served-model-name", name, "--engine", "optimum",
            "--device", "cpu", "--batch-size", str(batch_size), "--port", str(port), "--host", "127.0.0.1",
            "--pooling-method", pooling, "--no-bettertransformer"]


if __name__ == "__main__":
    print(python())

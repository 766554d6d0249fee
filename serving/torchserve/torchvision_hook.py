"""``import torchvision`` that works in every process of an environment with CPU torch and a CUDA-built
torchvision, not only in handler processes.

Why: PyPI's torchvision cannot load its operators next to CPU torch (serving/torchserve/vision_ops.py),
and libraries import it on their own once it is installed: transformers' image processors do, in the
worker's tokenizer path and in tests, and then fail with "operator torchvision::nms does not exist".
A ``.pth`` line (``python -m serving.torchserve.install_hook`` writes it into the environment's
site-packages: scripts/setup.sh and the Dockerfile with the ``torch`` extra run it) puts this finder
first on ``sys.meta_path``: the
first ``import torchvision`` in a process goes through ``ensure_torchvision``, which imports it as it
is where it works and with the CPU operators where its extension cannot load, and the import then
hands back that module. Nothing is imported at start: the finder only looks at the name asked for.
"""
from __future__ import annotations

import importlib.util
import sys
from importlib.abc import Loader, MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any, Sequence


class _Imported(Loader):
    """Hands back the module ``ensure_torchvision`` already imported."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        """Already executed."""


class TorchvisionFinder(MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: Any = None) -> ModuleSpec | None:
        if fullname != "torchvision":
            return None
        remove()  # once: the import below, and any later one, take the ordinary way
        from serving.torchserve.vision_ops import ensure_torchvision

        ensure_torchvision()  # raises as a plain import would when torchvision is missing or broken otherwise
        # Handed back through this spec's loader. Out of sys.modules meanwhile: the import system takes a
        # module it finds there for a parent's import and runs it again from its own spec.
        module = sys.modules.pop("torchvision")
        return importlib.util.spec_from_loader(fullname, _Imported(module), is_package=True)


def install() -> None:
    if not any(isinstance(finder, TorchvisionFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionFinder())


def remove() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, TorchvisionFinder)]


install()

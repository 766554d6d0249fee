"""`import torchvision` in any process of the project's venv: PyPI's CUDA-built torchvision beside CPU torch
goes through serving/torchserve/torchvision_hook.py (the .pth line scripts/setup.sh writes), so
transformers' image processors and TorchServe's image handlers import it. Fresh interpreters: the
point is what happens at a process's start."""
from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

PTH = "serving-torchvision.pth"


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, cwd="/")


def test_setup_wrote_the_pth_line_into_the_venv():
    found = [Path(p) / PTH for p in site.getsitepackages() if (Path(p) / PTH).is_file()]
    assert found, f"scripts/setup.sh writes {PTH} into the venv's site-packages"
    assert "serving.torchserve.torchvision_hook" in found[0].read_text()


def test_a_fresh_process_imports_torchvision_and_runs_its_ops():
    done = _run("import torch, torchvision, torchvision.transforms as T\n"
                "from torchvision.ops import nms\n"
                "keep = nms(torch.tensor([[0, 0, 10, 10], [1, 1, 10, 10], [20, 20, 30, 30.]]),"
                " torch.tensor([0.9, 0.8, 0.7]), 0.5)\n"
                "print(keep.tolist(), T.Resize(4)(torch.zeros(3, 8, 8)).shape[-1])")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[0, 2] 4"


def test_torchvision_runs_its_package_once_more_at_most():
    """The hook hands back the module it imported: torchvision's ``__init__`` runs once where its operators
    load, twice where they do not (the failed attempt, then the import on the CPU operators), never a
    third time from the import system itself."""
    done = _run("import sys, torch\n"
                "runs = []\n"
                "def count(frame, event, arg):\n"
                "    code = frame.f_code\n"
                "    if event == 'call' and code.co_name == '<module>' and "
                "code.co_filename.endswith('torchvision/__init__.py'):\n"
                "        runs.append(1)\n"
                "sys.setprofile(count)\n"
                "import torchvision\n"
                "sys.setprofile(None)\n"
                "from serving.torchserve.vision_ops import ensure_torchvision\n"
                "print(len(runs), ensure_torchvision())")
    assert done.returncode == 0, done.stderr[-2000:]
    runs, mode = done.stdout.split()[-2:]
    assert int(runs) == {"native": 1, "cpu-ops": 2}[mode], done.stdout


def test_transformers_image_processing_imports():
    done = _run("from transformers.image_utils import load_image\n"
                "from transformers import ViTImageProcessor\n"
                "import numpy as np\n"
                "out = ViTImageProcessor(size={'height': 8, 'width': 8})(np.zeros((16, 16, 3), dtype=np.uint8))\n"
                "print(out['pixel_values'][0].shape)")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "3, 8, 8" in done.stdout


def test_without_the_hook_the_import_fails_as_the_issue_says():
    """The check proves something: the same venv with the hook removed first fails on the CPU torch."""
    done = _run("import sys\n"
                "from serving.torchserve import torchvision_hook\n"
                "torchvision_hook.remove()\n"
                "import torchvision")
    torch_build = _run("import torch; print(torch.__version__)").stdout.strip()
    assert done.returncode != 0, f"torchvision imported without the hook beside torch {torch_build}: " \
                                 "a matched install, where this test has nothing to prove"
    assert "torchvision::nms does not exist" in done.stderr

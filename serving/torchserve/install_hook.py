"""``python -m serving.torchserve.install_hook``: the environment's ``.pth`` line that loads
serving/torchserve/torchvision_hook.py at every interpreter start (why: that module's docstring).
Run by scripts/setup.sh and by the Dockerfile when the ``torch`` extra is installed; idempotent."""
from __future__ import annotations

import sysconfig
from pathlib import Path

PTH = "serving-torchvision.pth"
# a .pth "import" line runs at every interpreter start of the environment: a missing package must not
# print an error there, so the import is guarded
PTH_LINE = 'import sys; exec("try:\\n import serving.torchserve.torchvision_hook\\nexcept ImportError:\\n pass")\n'


def write_pth(site_packages: Path | None = None) -> Path:
    path = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH
    if not path.exists() or path.read_text() != PTH_LINE:
        path.write_text(PTH_LINE)
    return path


if __name__ == "__main__":
    print(f"wrote {write_pth()}")

"""The platform's images as scripts/images.sh builds them with podman, under tags of one test run's own.

Shared by the compose test (tests/deploy/test_compose_up.py) and the Kubernetes test
(tests/deploy/kube/test_helm_install.py). The engine's images are shared between checkouts: a build
from another checkout tagging serving:latest meanwhile once swapped the image under a test, hence a
tag per run; the layer cache is shared all the same, so a second build in a session is quick.
"""
from __future__ import annotations

import subprocess
import time

from tests.deploy.artifacts import REPO

STANDIN_TARGETS = ("postgres", "kafka", "prometheus", "gateway")  # deploy/stand-ins/Dockerfile


def image_names(tag: str) -> dict[str, str]:
    """The compose settings naming the images scripts/images.sh builds, under ``tag``."""
    names = {"SERVING_IMAGE": f"localhost/serving:{tag}", "SERVING_TRITON_IMAGE": f"localhost/serving-triton:{tag}"}
    for target in STANDIN_TARGETS:
        names[f"SERVING_STANDIN_{target.upper()}_IMAGE"] = f"localhost/serving-standin-{target}:{tag}"
    return names


def build(tag: str, env: dict[str, str]) -> tuple[dict[str, str], float]:
    """scripts/images.sh under ``tag``: (the image names, seconds the build took)."""
    names = image_names(tag)
    env = {**env, "SERVING_IMAGE": names["SERVING_IMAGE"], "SERVING_TRITON_IMAGE": names["SERVING_TRITON_IMAGE"],
           "SERVING_STANDIN_TAG": tag}
    start = time.monotonic()
    out = subprocess.run(["bash", str(REPO / "scripts" / "images.sh")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=2100)
    assert out.returncode == 0, f"scripts/images.sh failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return names, time.monotonic() - start


def untag(names: dict[str, str], env: dict[str, str]) -> None:
    """Remove the run's tags (the layers stay cached); images never built or still in use are skipped."""
    subprocess.run(["podman", "rmi", "--ignore", *names.values()], env=env, capture_output=True, timeout=300)

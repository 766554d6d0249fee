"""A container engine for the compose test: podman (or Docker), driven with the ``docker`` SDK.

Podman serves Docker's API (``podman system service``), so everything here goes through the
``docker`` SDK and works unchanged against a Docker daemon (``SERVING_TEST_ENGINE=docker``, with
``DOCKER_HOST`` or the default socket). Compose itself is ``podman-compose`` (PyPI) for podman,
``docker compose`` for Docker. On podman, ``deploy/containers.conf`` (runc, ulimits, netavark)
is used unless ``CONTAINERS_CONF`` names another file.

``why_not()`` says why no engine can run containers here. Where ``must_run()`` (CI=true, or
``SERVING_TEST_COMPOSE=1``) that is a failure naming the reason; elsewhere the test is skipped
with it. ``SERVING_TEST_COMPOSE=0`` always skips (an explicit choice, named as the reason).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.deploy.artifacts import DEPLOY, REPO
from tests.support.ci import in_ci

BASE_IMAGE = os.environ.get("SERVING_BASE_IMAGE", "localhost/serving-base:bookworm")


def engine_name() -> str:
    return os.environ.get("SERVING_TEST_ENGINE", "podman")


def engine_env() -> dict[str, str]:
    env = dict(os.environ)
    if engine_name() == "podman":
        env.setdefault("CONTAINERS_CONF", str(DEPLOY / "containers.conf"))
    return env


def must_run() -> str | None:
    """Why a compose stack that cannot run here must fail rather than skip (None: it may skip)."""
    flag = os.environ.get("SERVING_TEST_COMPOSE")
    if flag == "1":
        return "SERVING_TEST_COMPOSE=1"
    if in_ci() and flag != "0":
        return "CI=true"
    return None


def why_not() -> str | None:
    """None when containers can be built and run here, else the reason they cannot."""
    if os.environ.get("SERVING_TEST_COMPOSE") == "0":
        return "SERVING_TEST_COMPOSE=0"
    name = engine_name()
    if shutil.which(name) is None:
        return f"no container engine: `{name}` is not installed (scripts/setup.sh installs podman)"
    for module in ("docker", "podman_compose") if name == "podman" else ("docker",):
        try:
            __import__(module)
        except ImportError:
            return f"the Python package {module!r} is missing (the project's test extra installs it)"
    info = subprocess.run([name, "info"], env=engine_env(), capture_output=True, text=True, timeout=120)
    if info.returncode != 0:
        return f"`{name} info` fails: {info.stderr.strip()[-500:]}"
    if name == "podman" and not _has_image(BASE_IMAGE):
        # the base image is made with debootstrap, which needs root
        if os.geteuid() != 0 or shutil.which("debootstrap") is None:
            return "the base image must be built with debootstrap, which needs root and the debootstrap package"
        base = subprocess.run(["bash", str(REPO / "scripts" / "images.sh"), "--base"], env=engine_env(),
                              capture_output=True, text=True, timeout=1200)
        if base.returncode != 0:
            return f"scripts/images.sh --base failed: {base.stderr.strip()[-1500:]}"
    probe_image = BASE_IMAGE if name == "podman" else None
    if probe_image:
        run = subprocess.run([name, "run", "--rm", probe_image, "true"], env=engine_env(),
                             capture_output=True, text=True, timeout=120)
        if run.returncode != 0:
            return f"`{name} run` cannot start a container here: {run.stderr.strip()[-800:]}"
    return None


def _has_image(ref: str) -> bool:
    return subprocess.run([engine_name(), "image", "inspect", ref], env=engine_env(),
                          capture_output=True).returncode == 0


@dataclass
class Engine:
    """The engine's Docker-compatible API (a ``docker.DockerClient``) and the compose command."""

    client: Any
    compose_cmd: list[str]
    env: dict[str, str]
    _service: subprocess.Popen | None = None
    _tmp: Path | None = None
    _log: Any = field(default=None, repr=False)

    @classmethod
    def start(cls) -> "Engine":
        import docker

        env = engine_env()
        if engine_name() != "podman":
            return cls(docker.from_env(timeout=120), ["docker", "compose"], env)
        tmp = Path(tempfile.mkdtemp(prefix="serving-podman-api-"))
        sock = tmp / "podman.sock"
        log = open(tmp / "service.log", "wb")
        service = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{sock}"],
                                   env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while not sock.exists():
            if service.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start: {(tmp / 'service.log').read_text()}")
            time.sleep(0.1)
        client = docker.DockerClient(base_url=f"unix://{sock}", timeout=120)
        client.ping()
        return cls(client, [sys.executable, "-m", "podman_compose"], env, service, tmp, log)

    def close(self) -> None:
        self.client.close()
        if self._service is not None:
            self._service.terminate()
            try:
                self._service.wait(15)
            except subprocess.TimeoutExpired:
                self._service.kill()
                self._service.wait()
            self._log.close()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    # --- one compose project -------------------------------------------------------------

    def containers(self, project: str, all: bool = False) -> list[Any]:
        return self.client.containers.list(all=all, filters={"label": f"com.docker.compose.project={project}"})

    def service_containers(self, project: str) -> dict[str, Any]:
        return {c.labels.get("com.docker.compose.service"): c for c in self.containers(project)}

    def health(self, container: Any) -> str:
        """healthy / unhealthy / starting / none. Podman without systemd schedules no health
        checks, so when the engine has recorded no result yet, the container's own healthcheck
        is run once (`podman healthcheck run`; with Docker, its command over exec) and its exit
        status decides."""
        container.reload()
        state = container.attrs.get("State", {})
        if state.get("Status") != "running":
            return state.get("Status", "unknown")
        status = (state.get("Health") or {}).get("Status")
        if status == "healthy":
            return status
        test = ((container.attrs.get("Config") or {}).get("Healthcheck") or {}).get("Test") or []
        if not test or test[0] == "NONE":
            return "none"
        if self._service is not None:
            # podman runs the check itself and records the result. An exec session over the API
            # (podman 4.3) would leave its conmon process running after the container is gone.
            run = subprocess.run(["podman", "healthcheck", "run", container.id], env=self.env,
                                 capture_output=True, timeout=120)
            return "healthy" if run.returncode == 0 else "starting"
        cmd = ["/bin/sh", "-c", test[1]] if test[0] == "CMD-SHELL" else test[1:]
        code, _ = container.exec_run(cmd, demux=False)
        return "healthy" if code == 0 else "starting"

    def logs(self, project: str, tail: int = 40) -> str:
        out = []
        for c in self.containers(project, all=True):
            try:
                text = c.logs(tail=tail).decode(errors="replace")
            except Exception as exc:  # a container removed meanwhile
                text = repr(exc)
            out.append(f"--- {c.name} ({c.status})\n{text}")
        return "\n".join(out)

    def remove_project(self, project: str) -> None:
        """Whatever compose left of ``project``: containers, its volumes and networks."""
        label = f"com.docker.compose.project={project}"
        for c in self.client.containers.list(all=True, filters={"label": label}):
            c.remove(force=True, v=True)
        for v in self.client.volumes.list(filters={"label": label}):
            v.remove(force=True)
        for n in self.client.networks.list(filters={"label": label}):
            n.remove()

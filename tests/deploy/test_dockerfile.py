"""The Dockerfile runs real CLI commands, as a non-root user, with a working healthcheck.

No image is built (there is no container engine where CI runs); instead the
healthcheck script embedded in the Dockerfile is run here against real processes.
"""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.deploy.artifacts import REPO, cli_commands, compose, manifests
from tests.support.procs import free_port, serving_process, wait_http

DOCKERFILE = (REPO / "Dockerfile").read_text()


def instruction(name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", DOCKERFILE, flags=re.MULTILINE)


def healthcheck_script() -> str:
    m = re.search(r"^COPY [^\n]*<<'PY' (\S+)\n(.*?)\nPY$", DOCKERFILE, flags=re.MULTILINE | re.DOTALL)
    assert m and m.group(1) == "/usr/local/bin/serving-healthcheck"
    return m.group(2)


def test_entrypoint_and_default_command_are_real_cli_commands():
    assert instruction("ENTRYPOINT") == ['["serving"]']
    (cmd,) = instruction("CMD")
    assert re.fullmatch(r'\["([a-z-]+)"\]', cmd).group(1) in cli_commands()


def test_commands_the_deployments_run_exist_in_the_cli():
    commands = cli_commands()
    assert {"control-plane", "worker", "statistics"} <= commands
    services = compose()["services"]
    for name in ("control-plane", "worker", "statistics"):
        assert services[name]["command"][0] == name
    for doc in manifests("default"):
        if doc["kind"] == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["image"].startswith("serving:"):
                    assert c["args"][0] in commands


def test_runs_as_a_non_root_user_and_declares_a_healthcheck():
    (user,) = instruction("USER")
    assert not user.startswith(("root", "0"))
    assert 'CMD ["serving-healthcheck"]' in instruction("HEALTHCHECK")[0]
    assert "--uid ${UID}" in DOCKERFILE and re.search(r"^ARG UID=(\d+)$", DOCKERFILE, re.M).group(1) != "0"


def test_image_env_names_are_settings_the_code_reads():
    from tests.deploy.artifacts import all_env_names

    names = set(re.findall(r"\b(SERVING_[A-Z_]+)=", DOCKERFILE))
    assert names and names <= all_env_names(), names - all_env_names()


def test_every_package_the_project_installs_is_in_the_build_context():
    import tomllib

    include = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    for pattern in include:
        package = pattern.rstrip("*")
        assert f"!{package}/" in ignore
        assert f"COPY {package} ./{package}" in DOCKERFILE
    assert "!pyproject.toml" in ignore and "!README.md" in ignore  # pyproject's readme


def _run_healthcheck(pid: int, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", healthcheck_script(), str(pid)], env=env,
                          capture_output=True, text=True, timeout=60, cwd=REPO)


@pytest.mark.timeout(120)
def test_healthcheck_probes_the_statistics_service_it_finds_running(tmp_path):
    import os

    port = free_port()
    env = {**os.environ, "SERVING_HOME": str(tmp_path), "SERVING_STATISTICS_PORT": str(port),
           "SERVING_CONTROL_PLANE_URL": f"http://127.0.0.1:{free_port()}"}
    env.pop("SERVING_KAFKA_BOOTSTRAP_SERVERS", None)
    with serving_process(["statistics"], env, tmp_path / "statistics.log") as proc:
        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        ok = _run_healthcheck(proc.pid, env)
        assert ok.returncode == 0, ok.stderr
        wrong_port = _run_healthcheck(proc.pid, {**env, "SERVING_STATISTICS_PORT": str(free_port())})
        assert wrong_port.returncode != 0 and "/health" in wrong_port.stderr
    # a process that is none of our services (a one-off command) has nothing to probe
    other = subprocess.Popen(["sleep", "30"])
    try:
        assert _run_healthcheck(other.pid, env).returncode == 0
    finally:
        other.kill()
        other.wait()


def test_the_image_s_services_run_without_nvidia_pytriton(tmp_path):
    """The Dockerfile uninstalls nvidia-pytriton (a whole Triton server) from the image."""
    assert "pip uninstall -y nvidia-pytriton" in DOCKERFILE
    code = (
        "import sys; sys.modules['pytriton'] = None\n"  # any `import pytriton...` now fails
        "import serving.cli.main, registry.api, serving.worker.app, serving.statistics.service\n"
        "import serving.worker.main, serving.triton.repository\n"
        "from serving.settings import WorkerSettings\n"
        "serving.worker.app.create_app(WorkerSettings(home=sys.argv[1]))\n"
    )
    with_block = subprocess.run([sys.executable, "-c", code, str(tmp_path)],
                                capture_output=True, text=True, timeout=120, cwd=REPO)
    assert with_block.returncode == 0, with_block.stderr[-2000:]
    probe = subprocess.run([sys.executable, "-c", "import sys; sys.modules['pytriton'] = None\n"
                            "import pytriton.triton"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert probe.returncode != 0, "the block must actually stop pytriton imports"

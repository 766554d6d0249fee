"""The tritonserver command line the compose file and the chart use starts a real Triton.

NVIDIA's container cannot run here (no container engine), but the nvidia-pytriton wheel
(a project dependency) ships a real ``tritonserver`` binary. It has only the python
backend, so this checks the flags (explicit model control, ``--load-model=*``, staying up
and ready when a model in the repository cannot be loaded, the ports), not ONNX serving.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.deploy.artifacts import component, compose, find, manifests
from tests.support.ci import cannot_run
from tests.support.procs import free_port, stop, wait_http


def compose_args() -> list[str]:
    command = compose()["services"]["triton"]["command"]
    assert command[0] == "tritonserver"
    return command[1:]


def chart_args() -> list[str]:
    (triton,) = [d for d in find(manifests("default"), "Deployment") if component(d) == "triton"]
    container = triton["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["tritonserver"]
    return container["args"]


def test_compose_and_chart_run_triton_with_the_same_flags():
    assert compose_args() == chart_args()


def _pytriton_server() -> Path:
    import pytriton

    root = Path(pytriton.__file__).parent / "tritonserver"
    if not (root / "bin" / "tritonserver").exists():
        cannot_run("nvidia-pytriton ships no tritonserver binary on this platform")
    return root


@pytest.mark.timeout(120)
@pytest.mark.parametrize("source", ["compose", "chart"])
def test_the_flags_start_tritonserver_in_explicit_mode_despite_a_broken_model(source, tmp_path):
    import sysconfig

    root = _pytriton_server()
    ports = {"--http-port": free_port(), "--grpc-port": free_port(), "--metrics-port": free_port()}
    args = []
    for arg in compose_args() if source == "compose" else chart_args():
        flag, _, value = arg.partition("=")
        if flag == "--model-repository":
            value = str(tmp_path / "models")
        elif flag in ports:
            value = str(ports.pop(flag))
        args.append(f"{flag}={value}")
    assert not ports, f"flags not set: {ports}"
    # a model Triton cannot load (this build has no onnxruntime backend) must not keep it down
    (tmp_path / "models" / "broken_v1" / "1").mkdir(parents=True)
    (tmp_path / "models" / "broken_v1" / "config.pbtxt").write_text(
        'name: "broken_v1"\nbackend: "onnxruntime"\nmax_batch_size: 0\n')
    env = {**os.environ, "LD_LIBRARY_PATH": f"{root / 'lib'}:{sysconfig.get_config_var('LIBDIR')}"}
    http = next(a for a in args if a.startswith("--http-port=")).split("=")[1]
    with open(tmp_path / "triton.log", "wb") as log:
        proc = subprocess.Popen([str(root / "bin" / "tritonserver"), *args,
                                 f"--backend-directory={root / 'backends'}"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{http}"
        wait_http(f"{base}/v2/health/ready", timeout=90, proc=proc)
        (broken,) = httpx.post(f"{base}/v2/repository/index").json()
        assert (broken["name"], broken["state"]) == ("broken_v1", "UNAVAILABLE")
        # explicit mode: Triton tries the load (and fails: no such model) instead of
        # refusing load requests altogether, as it does without explicit control
        refused = httpx.post(f"{base}/v2/repository/models/absent_v1/load")
        assert refused.status_code >= 400 and "failed to load 'absent_v1'" in refused.text, refused.text
    except Exception:
        print((tmp_path / "triton.log").read_text()[-3000:])
        raise
    finally:
        stop(proc)

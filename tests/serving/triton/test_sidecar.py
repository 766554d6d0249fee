"""`serving triton-sidecar`: one Triton pod's model loader beside a plain tritonserver (NVIDIA's image).

A real tritonserver (the nvidia-pytriton wheel's binary: python backend only, no onnxruntime
backend) runs with the chart's flags for NVIDIA's image in per-pod mode: explicit model control
over its own repository directory (the pod's emptyDir), no access key. A real `serving
triton-sidecar` process follows the control plane (tests/serving/triton/fake_control_plane.py:
the config stream and the artifacts), writes that directory, loads over localhost and serves the
pod's readiness. The model is a Python-backend model (tests/serving/triton/triton_models.py);
its answer is compared with its own model.py run directly. An ONNX model stands for a model this
Triton refuses (it has no onnxruntime backend): refused models must not hold the pod back.
"""
from __future__ import annotations

import hashlib
import subprocess

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from serving.triton.model_folder import pack
from serving.triton.model_formats import FORMATS
from serving.triton.python_backend import remove_shm
from tests.serving.triton.fake_control_plane import FakeControlPlane, running, target, triton_endpoint
from tests.serving.triton.triton_models import run_model_py, shout_folder
from tests.support.ci import cannot_run
from tests.support.procs import free_port, serving_process, stop, wait_http, wait_until


def tritonserver(workspace, repo, http: int, grpc: int, metrics: int, log) -> tuple[subprocess.Popen, str]:
    """tritonserver as the chart runs NVIDIA's image in per-pod mode (helm/serving/templates/triton.yaml):
    explicit model control, ``--load-model=*``, no access key on its API. The wheel's binary needs the
    embedded Triton's backend directory and library path (serving/triton/python_backend.py), taken from
    its command line, less its access key and its strict readiness."""
    from serving.triton.embedded import fix_library_path
    from serving.triton.python_backend import server_command

    try:
        fix_library_path()
        command = server_command(workspace, repo, "127.0.0.1", http, grpc, metrics)
    except (ImportError, FileNotFoundError) as exc:
        cannot_run(f"no tritonserver from the nvidia-pytriton wheel here: {exc}")
    args = [a for a in command.args if not a.startswith(("--http-restricted-api", "--grpc-restricted-protocol",
                                                          "--strict-readiness"))]
    args += ["--load-model=*", "--exit-on-error=false", "--strict-readiness=false"]
    return subprocess.Popen(args, env=command.env, stdout=log, stderr=subprocess.STDOUT), command.shm_prefix


def readiness(port: int) -> tuple[int, dict]:
    r = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5)
    return r.status_code, r.json()


@pytest.mark.timeout(180)
def test_sidecar_loads_the_pods_models_and_gates_its_readiness(tmp_path, tiny_model):
    repo = tmp_path / "pod-models"  # the pod's emptyDir
    repo.mkdir()
    folder = shout_folder(tmp_path / "src", suffix="!")
    archive = tmp_path / "shout.tar"
    archive.write_bytes(pack(folder, FORMATS["python"]))
    fake = FakeControlPlane()
    sha_py = hashlib.sha256(archive.read_bytes()).hexdigest()  # withheld at first
    sha_onnx = fake.add_artifact(tiny_model.onnx_path)
    py = {**target("py", 1, sha_py, {}), "framework": "python"}
    endpoints = {"py": {**triton_endpoint("py", [py], max_batch_size=0)},
                 "clf": triton_endpoint("clf", [target("clf", 1, sha_onnx, tiny_model.signature)])}
    fake.publish(endpoints)
    http, grpc, metrics, ready_port = free_port(), free_port(), free_port(), free_port()
    with running(fake) as cp_url, open(tmp_path / "tritonserver.log", "wb") as log:
        server, shm_prefix = tritonserver(tmp_path / "triton-ws", repo, http, grpc, metrics, log)
        env = {"SERVING_HOME": str(tmp_path / "home"), "SERVING_CONTROL_PLANE_URL": cp_url,
               "SERVING_TRITON_MODEL_REPOSITORY": str(repo),
               "SERVING_TRITON_CONTROL_URL": f"http://127.0.0.1:{http}",
               "SERVING_TRITON_READINESS_PORT": str(ready_port)}
        try:
            with serving_process(["triton-sidecar"], env, tmp_path / "sidecar.log") as sidecar:
                wait_http(f"http://127.0.0.1:{ready_port}/live", timeout=30, proc=sidecar)
                wait_http(f"http://127.0.0.1:{http}/v2/health/live", timeout=90, proc=server)
                # the ONNX model is refused by this Triton: named, not waited on; py's artifact cannot be
                # had yet: waited on
                wait_until(lambda: "clf_v1" in readiness(ready_port)[1]["refused"], 60, "clf_v1 refused")
                status, body = readiness(ready_port)
                assert (status, body["ready"], body["waiting"]) == (503, False, ["py_v1"]), body

                fake.add_artifact(archive)
                wait_until(lambda: readiness(ready_port)[0] == 200, 60, "the pod ready", interval=0.05)
                assert httpx.get(f"http://127.0.0.1:{http}/v2/models/py_v1/ready", timeout=5).status_code == 200
                assert sorted(p.name for p in repo.iterdir() if not p.name.startswith(".")) == ["clf_v1", "py_v1"]

                client = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
                text = httpclient.InferInput("TEXT", [2], "BYTES")
                text.set_data_from_numpy(np.array(["naïve".encode(), b"ok"], dtype=np.object_))
                got = client.infer("py_v1", [text])
                client.close()
                want = run_model_py(folder, ["naïve", "ok"], "!")
                assert got.as_numpy("UPPER").tolist() == want["UPPER"].tolist() == ["NAÏVE!".encode(), b"OK!"]
                assert got.as_numpy("LENGTH").tolist() == want["LENGTH"].tolist()

                # a model deployed later does not take the ready pod out (only the first load gates it)
                sha_late = hashlib.sha256(b"not uploaded yet").hexdigest()
                late = {**target("late", 1, sha_late, {}), "framework": "python"}
                fake.publish({**endpoints, "late": triton_endpoint("late", [late], max_batch_size=0)})
                wait_until(lambda: readiness(ready_port)[1]["waiting"] == ["late_v1"], 30, "late_v1 waited on")
                assert readiness(ready_port)[0] == 200

                # removed from the configuration: unloaded and deleted; the pod stays ready
                fake.publish({"clf": endpoints["clf"]})
                wait_until(lambda: httpx.get(f"http://127.0.0.1:{http}/v2/models/py_v1/ready",
                                             timeout=5).status_code != 200, 30, "py_v1 unloaded")
                wait_until(lambda: not (repo / "py_v1").exists(), 10, "py_v1's files removed")
                assert readiness(ready_port)[0] == 200
                assert sidecar.poll() is None
        finally:
            stop(server)
            remove_shm(shm_prefix)
    assert "Traceback" not in (tmp_path / "sidecar.log").read_text()

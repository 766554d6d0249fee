"""The ClearML runtime pieces in-process (a socket adds nothing here): name binding in any order,
pipeline statistics, the user-code deadline, per-endpoint packages, and request bodies."""
from __future__ import annotations

import asyncio
import gzip
import itertools
import time
import zipfile
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from transformers import AutoTokenizer

from tests.serving.clearml import digits
from tests.serving.clearml.models import EXAMPLES, sklearn_logistic
from tests.serving.worker.support import endpoint_spec

ORDERED_PREPROCESS = '''
import numpy as np
from transformers import AutoTokenizer

ORDER = {order!r}


class Preprocess:
    def __init__(self):
        self.tok = AutoTokenizer.from_pretrained({tokenizer!r})

    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        enc = self.tok(text=body["text"], return_tensors="np")
        return [enc[name].tolist() for name in ORDER]

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {{"data": np.asarray(data).tolist()}}
'''


def user_file(store, tmp_path: Path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(source)
    return store.put_file(path)[0]


def declared(*names: str) -> dict:
    return {"inputs": [{"name": n, "dtype": None, "shape": None} for n in names], "outputs": []}


@pytest.mark.parametrize("order", list(itertools.permutations(("input_ids", "attention_mask", "token_type_ids"))))
def test_list_bound_by_declared_names_in_any_order(make_client, store, tmp_path, tiny_model, order):
    source = ORDERED_PREPROCESS.format(order=list(order), tokenizer=str(tiny_model.tokenizer_dir))
    sha = user_file(store, tmp_path, "ordered.py", source)
    spec = endpoint_spec("ordered", tiny_model, store, tmp_path, preprocess={"kind": "user", "artifact": sha})
    spec["io"] = declared(*order)
    client, _ = make_client(spec)
    text = "nothing arrived and support never answered"
    r = client.post("/serve/ordered", json={"text": text})
    assert r.status_code == 200, r.text
    enc = AutoTokenizer.from_pretrained(str(tiny_model.tokenizer_dir))(text, return_tensors="np")
    sess = ort.InferenceSession(str(tiny_model.onnx_path))
    expected = sess.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()})[0]
    np.testing.assert_allclose(r.json()["data"], expected, atol=1e-4)


def sklearn_spec(name: str, store, model_path: Path, preprocess_sha: str, engine: str = "sklearn") -> dict:
    sha = store.put_file(model_path)[0]
    return {"name": name, "engine": engine, "preprocess": {"kind": "user", "artifact": preprocess_sha},
            "targets": [{"model": "sk", "version": 1, "weight": 100.0, "role": "stable", "triton_name": "sk_v1",
                         "artifact": sha, "framework": "sklearn", "signature": {"inputs": [], "outputs": []}}],
            "metrics": [], "log_freq": 1.0, "batching": {"max_batch_size": 0}}


@pytest.mark.parametrize("engine,file", [("custom", "preprocess.py"), ("custom_async", "async_preprocess.py")])
def test_pipeline_records_statistics_of_every_request(make_client, store, tmp_path, engine, file):
    import joblib

    model = sklearn_logistic(tmp_path)
    sk = store.put_file(EXAMPLES / "sklearn" / "preprocess.py")[0]
    pipe = store.put_file(EXAMPLES / "pipeline" / file)[0]
    pipeline = {"name": "pipe", "engine": engine, "preprocess": {"kind": "user", "artifact": pipe}, "targets": [],
                "metrics": [], "log_freq": 1.0, "batching": {}}
    client, recorder = make_client(sklearn_spec("test_model_sklearn_a", store, model, sk),
                                   sklearn_spec("test_model_sklearn_b", store, model, sk), pipeline)
    r = client.post("/serve/pipe", json={"x0": 1, "x1": 2})
    assert r.status_code == 200, r.text
    y = joblib.load(model).predict([[1, 2]])[0]
    assert r.json() == {"y": float(y)} and r.headers["X-Model-Version"] == "0"
    seen = sorted((e["endpoint"], e["status"]) for e in recorder.events)
    assert seen == [("pipe", 200), ("test_model_sklearn_a", 200), ("test_model_sklearn_b", 200)]


SLOW = '''
import time


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        time.sleep(body.get("sleep", 0))
        return body

    def process(self, data, state, collect_custom_statistics_fn=None):
        return data
'''


def test_user_code_past_its_deadline_is_504_and_does_not_starve_other_endpoints(make_client, store, tmp_path):
    sha = user_file(store, tmp_path, "slow.py", SLOW)
    slow = {"name": "slow", "engine": "custom", "targets": [], "metrics": [], "log_freq": 1.0, "batching": {},
            "preprocess": {"kind": "user", "artifact": sha, "options": {"timeout_s": 0.5}}}
    fast = {**slow, "name": "fast", "preprocess": {"kind": "user", "artifact": sha}}
    client, recorder = make_client(slow, fast)
    t0 = time.monotonic()
    r = client.post("/serve/slow", json={"sleep": 3})
    assert r.status_code == 504 and "within 0.5 s" in r.json()["error"], r.text
    assert time.monotonic() - t0 < 2.5
    assert recorder.events[-1]["status"] == 504

    async def burst() -> tuple[float, int]:
        transport = httpx.ASGITransport(app=client.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w") as c:
            slow_calls = [asyncio.create_task(c.post("/serve/slow", json={"sleep": 5})) for _ in range(16)]
            await asyncio.sleep(0.1)  # the slow endpoint's threads are all busy now
            t = time.monotonic()
            r = await c.post("/serve/fast", json={"x": 1})
            took = time.monotonic() - t
            await asyncio.gather(*slow_calls)
            return took, r.status_code

    took, status = asyncio.run(burst())
    # 16 sleeping calls hold all 8 of the slow endpoint's threads for 5 s; the fast one has its own
    # (the bound is far from both, for a saturated machine)
    assert status == 200 and took < 3.0, took


def tiny_wheel(tmp_path: Path) -> Path:
    """A pure-Python wheel made on the spot: the packages test needs no index and no build."""
    path = tmp_path / "serving_extra_probe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("serving_extra_probe/__init__.py", "ANSWER = 42\n")
        info = "serving_extra_probe-1.0.dist-info"
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: serving-extra-probe\nVersion: 1.0\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


NEEDS_PACKAGE = '''
import serving_extra_probe


class Preprocess:
    def process(self, data, state, collect_custom_statistics_fn=None):
        return {"answer": serving_extra_probe.ANSWER}
'''


def test_endpoint_requirements_are_installed_before_its_code_loads(make_client, store, tmp_path):
    sha = user_file(store, tmp_path, "needs.py", NEEDS_PACKAGE)
    spec = {"name": "needs", "engine": "custom", "targets": [], "metrics": [], "log_freq": 1.0, "batching": {},
            "preprocess": {"kind": "user", "artifact": sha}}
    client, _ = make_client(spec)
    r = client.post("/serve/needs", json={})
    assert r.status_code == 503 and "No module named 'serving_extra_probe'" in r.json()["error"]
    spec["preprocess"]["options"] = {"requirements": [str(tiny_wheel(tmp_path))]}
    client, _ = make_client(spec)
    r = client.post("/serve/needs", json={})
    assert r.status_code == 200 and r.json() == {"answer": 42}, r.text


def test_bodies_raw_bytes_gzip_and_encodings(make_client, clf_spec, store, tmp_path):
    echo = '''
class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        return {"type": type(body).__name__, "size": len(body)}

    def process(self, data, state, collect_custom_statistics_fn=None):
        return data
'''
    sha = user_file(store, tmp_path, "echo.py", echo)
    spec = {"name": "echo", "engine": "custom", "targets": [], "metrics": [], "log_freq": 1.0, "batching": {},
            "preprocess": {"kind": "user", "artifact": sha}}
    client, _ = make_client(spec, clf_spec, max_body_bytes=10_000)
    jpeg = digits.encoded(5)
    assert client.post("/serve/echo", content=jpeg, headers={"Content-Type": "image/jpeg"}).json() == \
        {"type": "bytes", "size": len(jpeg)}
    assert client.post("/serve/echo", json={"a": 1}).json() == {"type": "dict", "size": 1}
    zipped = client.post("/serve/echo", content=gzip.compress(b'{"a": 1, "b": 2}'),
                         headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert zipped.json() == {"type": "dict", "size": 2}
    r = client.post("/serve/echo", content=b"not gzip", headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "not valid gzip" in r.json()["error"]
    r = client.post("/serve/echo", content=gzip.compress(b"[" + b"0," * 20_000 + b"0]"),
                    headers={"Content-Encoding": "gzip"})
    assert r.status_code == 413 and "unpacks to over the limit" in r.json()["error"]
    r = client.post("/serve/echo", content=b"{}", headers={"Content-Encoding": "br"})
    assert r.status_code == 415 and "use gzip" in r.json()["error"]
    template = {"name": "tmpl", "engine": "custom", "targets": [], "metrics": [], "log_freq": 1.0, "batching": {},
                "preprocess": {"kind": "user", "artifact": store.put_file(
                    EXAMPLES / "preprocess_template" / "preprocess_template.py")[0]}}
    client2, _ = make_client(template)
    r = client2.post("/serve/tmpl", content=jpeg, headers={"Content-Type": "image/jpeg"})
    assert r.status_code == 200 and r.content == jpeg and r.headers["content-type"] == "application/octet-stream"
    r = client.post("/serve/clf", content=b"\x89PNG...", headers={"Content-Type": "image/png"})
    assert r.status_code == 422 and "JSON object" in r.json()["error"]


def test_worker_wide_extra_packages_land_on_every_process_path(tmp_path, monkeypatch):
    """SERVING_EXTRA_PYTHON_PACKAGES, ClearML's CLEARML_EXTRA_PYTHON_PACKAGES: installed under
    SERVING_HOME before uvicorn starts, and on the path its worker processes inherit."""
    import os
    import subprocess
    import sys

    from serving.settings import WorkerSettings
    from serving.worker.main import install_extra_packages

    monkeypatch.setenv("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    monkeypatch.setattr(sys, "path", list(sys.path))
    install_extra_packages(WorkerSettings(home=tmp_path, extra_python_packages=str(tiny_wheel(tmp_path))))
    child = subprocess.run([sys.executable, "-c", "import serving_extra_probe; print(serving_extra_probe.ANSWER)"],
                           capture_output=True, text=True, env=os.environ.copy())
    assert child.stdout.strip() == "42", child.stderr
    assert (tmp_path / "packages").is_dir()


SLOW_PROCESS = '''
import time


class Preprocess:
    def preprocess(self, body, state, collect_custom_statistics_fn=None):
        return body

    def process(self, data, state, collect_custom_statistics_fn=None):
        time.sleep(data.get("sleep", 0))
        return data

    def postprocess(self, data, state, collect_custom_statistics_fn=None):
        return {"done": True}
'''


def test_the_deadline_names_the_step_that_ran_past_it(make_client, store, tmp_path):
    """All three synchronous steps of a custom endpoint run in one thread hop; each keeps its deadline."""
    sha = user_file(store, tmp_path, "slow_process.py", SLOW_PROCESS)
    spec = {"name": "slowp", "engine": "custom", "targets": [], "metrics": [], "log_freq": 1.0, "batching": {},
            "preprocess": {"kind": "user", "artifact": sha, "options": {"timeout_s": 0.5}}}
    client, recorder = make_client(spec)
    r = client.post("/serve/slowp", json={"sleep": 2})
    assert r.status_code == 504 and "process() in preprocess.py did not finish within 0.5 s" in r.json()["error"], r.text
    assert client.post("/serve/slowp", json={"sleep": 0}).json() == {"done": True}
    assert [e["status"] for e in recorder.events] == [504, 200]
    assert set(recorder.events[-1]["stages"]) == {"preprocess", "inference", "postprocess"}


UNLOADING = '''
from pathlib import Path


class Preprocess:
    def process(self, data, state, collect_custom_statistics_fn=None):
        return {{"tag": {tag!r}}}

    def unload(self):
        with open({log!r}, "a") as f:
            f.write({tag!r} + "\\n")
        if {tag!r} == "bad":
            raise RuntimeError("unload failed on purpose")
'''


def test_unload_once_per_retired_instance_and_at_shutdown(make_client, store, tmp_path):
    """ClearML calls ``Preprocess.unload()`` when it drops an instance: here when a replaced definition
    is retired (one revision later: requests on the old config may still run it) and when the worker
    shuts down. A failing unload is logged; the worker carries on."""
    unloaded = tmp_path / "unloaded.txt"
    unloaded.touch()

    def spec(name: str, tag: str) -> dict:
        sha = user_file(store, tmp_path, f"{name}_{tag}.py", UNLOADING.format(tag=tag, log=str(unloaded)))
        return {"name": name, "engine": "custom", "targets": [], "metrics": [], "log_freq": 1.0, "batching": {},
                "preprocess": {"kind": "user", "artifact": sha}}

    client, _ = make_client(spec("a", "bad"), spec("b", "b1"))
    sync = client.app.state.dataplane.config
    sync.apply({"revision": 2, "endpoints": {e["name"]: e for e in (spec("a", "a2"), spec("b", "b1"))}})
    assert unloaded.read_text() == ""  # replaced, not retired yet
    sync.apply({"revision": 3, "endpoints": {e["name"]: e for e in (spec("a", "a2"),)}})  # b removed
    assert unloaded.read_text() == "bad\n"  # its unload raised: logged, and the worker still answers
    assert client.post("/serve/a", json={}).json() == {"tag": "a2"}
    client.__exit__(None, None, None)
    assert sorted(unloaded.read_text().split()) == ["a2", "b1", "bad"]  # each instance once

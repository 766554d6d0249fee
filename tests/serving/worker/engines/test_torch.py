"""Engine torch on its own: a TorchScript Triton model folder (config.pbtxt's INPUT__0/OUTPUT__0, as a
Triton user uploads it) served in the worker, the thread settings, and a model that is not loaded yet."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from serving.settings import WorkerSettings
from serving.triton.model_folder import describe, pack
from serving.triton.model_formats import FORMATS
from serving.worker.engines import torch as torch_engine
from serving.worker.errors import ModelNotReady
from serving.worker.runtime import Target
from tests.serving.worker.support import store_bytes

CONFIG = ('name: "net"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
          'input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [4] }]\n'
          'output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [2] }]\n')


def test_a_torchscript_model_folder_serves_with_its_config_s_tensors(make_client, store, tmp_path):
    torch.manual_seed(0)
    net = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Tanh()))
    (tmp_path / "net" / "1").mkdir(parents=True)
    torch.jit.save(net, str(tmp_path / "net" / "1" / "model.pt"))
    (tmp_path / "net" / "config.pbtxt").write_text(CONFIG)
    sha = store_bytes(store, pack(tmp_path / "net", FORMATS["torchscript"]), tmp_path, "net.tar.gz")
    signature = describe(store.path(sha), "torchscript")
    spec = {"name": "net", "engine": "torch", "preprocess": {"kind": "none"}, "metrics": [], "log_freq": 1.0,
            "batching": {"max_batch_size": 8}, "targets": [{"model": "net", "version": 1, "weight": 100.0,
                                                             "triton_name": "net_v1", "artifact": sha,
                                                             "framework": "torchscript", "signature": signature}]}
    client, _ = make_client(spec)
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    r = client.post("/serve/net", json={"inputs": {"INPUT__0": x.tolist()}})
    assert r.status_code == 200, r.text
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(r.json()["outputs"]["OUTPUT__0"], want, rtol=0, atol=1e-6)


def test_threads_and_parallel_inferences_follow_the_setting(tmp_path):
    engine = torch_engine.create(WorkerSettings(home=tmp_path, torch_threads=2), lambda sha: tmp_path / sha)
    assert engine.threads == 2 and engine.parallel == max(1, (__import__("os").cpu_count() or 1) // 2)


def test_a_model_not_loaded_is_not_ready(tmp_path):
    engine = torch_engine.create(WorkerSettings(home=tmp_path), lambda sha: tmp_path / sha)
    target = Target(model="m", version=1, weight=100.0, triton_name="m_v1", artifact="abc", inputs=(), outputs=(),
                    framework="torch-export")
    assert not engine.is_ready(target)
    with pytest.raises(ModelNotReady):
        asyncio.run(engine.infer(target, {"x": np.zeros((1, 4), np.float32)}))

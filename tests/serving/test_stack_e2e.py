"""The serving core end to end: CLI -> control plane -> workers -> real Triton, all real processes.

Tests run in file order and share one stack; the last one takes the control plane down.
"""
from __future__ import annotations

import asyncio
import collections
import time

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as triton_http
from scipy.stats import binomtest
from transformers import AutoTokenizer

from serving.testmodels import build_bert_classifier
from tests.serving.stack import Stack, make_stack
from tests.support.procs import wait_until

TEXT = "the service was quick and the staff were friendly"


def endpoint_ready(stack: Stack, endpoint: str) -> None:
    for i in range(len(stack.worker_ports)):
        url = f"{stack.worker_url(i)}/v2/models/{endpoint}/ready"
        wait_until(lambda: httpx.get(url, timeout=5).status_code == 200, 60, f"{endpoint} ready on worker {i}")


def reference_logits(bundle, texts: list[str]) -> np.ndarray:
    tok = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))
    enc = tok(texts, truncation=True, max_length=128, padding=True, return_tensors="np")
    sess = ort.InferenceSession(str(bundle.onnx_path), providers=["CPUExecutionProvider"])
    return sess.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()})[0]


@pytest.fixture(scope="module")
def second_model(tmp_path_factory):
    return build_bert_classifier(tmp_path_factory.mktemp("tiny-bert-v2"), seed=1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model):
    s = make_stack(tmp_path_factory.mktemp("stack"), workers=2)
    s.env["SERVING_WORKER_BATCHING"] = "true"  # off by default: keep the worker-side batcher covered here
    try:
        s.start_control_plane()
        s.start_triton()
        s.start_worker(0)
        s.start_worker(1)
        s.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        s.cli("model", "add", "--endpoint", "clf", "--model", "clf:1", "--tokenizer", str(tiny_model.tokenizer_dir),
              "--labels", ",".join(tiny_model.labels))
        endpoint_ready(s, "clf")
        yield s
    finally:
        s.stop_all()


def test_serve_through_triton_matches_onnxruntime(stack, tiny_model):
    r = httpx.post(f"{stack.worker_url(0)}/serve/clf", json={"text": TEXT}, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["X-Model-Version"] == "1"
    expected = reference_logits(tiny_model, [TEXT])[0]
    np.testing.assert_allclose(r.json()["logits"], expected, atol=1e-4)
    assert r.json()["label"] == tiny_model.labels[int(np.argmax(expected))]
    texts = [TEXT, "bad", "an average experience with some good parts and some that were not so good"]
    r = httpx.post(f"{stack.worker_url(1)}/serve/clf/1", json={"texts": texts}, timeout=30)
    got = np.array([p["logits"] for p in r.json()["predictions"]])
    np.testing.assert_allclose(got, reference_logits(tiny_model, texts), atol=1e-4)


def test_more_texts_than_tritons_max_batch_size_are_served_in_parts(stack, tiny_model):
    """256 texts (the documented limit) to an endpoint whose Triton max_batch_size is 32: the worker
    sends them as calls of at most 32 rows and joins the answers in order."""
    texts = [f"text number {i} " + "word " * (i % 40) for i in range(256)]
    r = httpx.post(f"{stack.worker_url(0)}/serve/clf/1", json={"texts": texts}, timeout=120)
    assert r.status_code == 200, r.text
    got = np.array([p["logits"] for p in r.json()["predictions"]])
    np.testing.assert_allclose(got, reference_logits(tiny_model, texts), atol=1e-4)


def test_concurrent_requests_of_different_lengths_batched_in_the_worker_match_onnxruntime(stack, tiny_model):
    """32 texts of 1 to 60 words at once: the worker merges what queues behind a Triton call into one
    padded request (serving/worker/batcher.py); each answer must still be its own text's logits."""
    words = TEXT.split()
    texts = [" ".join(words[j % len(words)] for j in range(1 + (7 * i) % 60)) for i in range(32)]
    url = f"{stack.worker_url(0)}/serve/clf"

    async def all_at_once() -> list[list[float]]:
        async with httpx.AsyncClient(timeout=30) as client:
            responses = await asyncio.gather(*(client.post(url, json={"text": t}) for t in texts))
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200]
        return [r.json()["logits"] for r in responses]

    expected = np.concatenate([reference_logits(tiny_model, [t]) for t in texts])
    np.testing.assert_allclose(np.array(asyncio.run(all_at_once())), expected, atol=1e-4)


def test_tritonclient_http_against_worker_v2(stack, tiny_model):
    tok = AutoTokenizer.from_pretrained(str(tiny_model.tokenizer_dir))
    enc = tok([TEXT], return_tensors="np")
    client = triton_http.InferenceServerClient(stack.worker_url(0).removeprefix("http://"))
    assert client.is_server_live() and client.is_model_ready("clf")
    inputs = []
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        tensor = triton_http.InferInput(name, list(enc[name].shape), "INT64")
        tensor.set_data_from_numpy(enc[name].astype(np.int64), binary_data=False)
        inputs.append(tensor)
    result = client.infer("clf", inputs, outputs=[triton_http.InferRequestedOutput("logits", binary_data=False)])
    np.testing.assert_allclose(result.as_numpy("logits"), reference_logits(tiny_model, [TEXT]), atol=1e-4)


async def _versions(url: str, n: int, concurrency: int = 16, key: str | None = None) -> list[str]:
    sem = asyncio.Semaphore(concurrency)
    headers = {"X-Routing-Key": key} if key else {}

    async def one(client: httpx.AsyncClient, i: int) -> str:
        async with sem:
            r = await client.post(url, json={"text": f"request number {i % 50}"}, headers=headers)
            assert r.status_code == 200, r.text
            return r.headers["X-Model-Version"]

    async with httpx.AsyncClient(timeout=30) as client:
        return await asyncio.gather(*(one(client, i) for i in range(n)))


def test_canary_share_and_sticky_routing(stack, tiny_model, second_model):
    stack.cli("model", "upload", "--name", "clf", "--path", str(second_model.onnx_path))
    out = stack.cli("model", "add", "--endpoint", "clf", "--model", "clf:2", "--tokenizer",
                    str(second_model.tokenizer_dir), "--canary", "10%").stdout
    assert "clf:1 90%" in out and "clf:2 10%" in out
    endpoint_ready(stack, "clf")
    # a worker keeps the previous routes until the canary is ready there (readiness gating): count only once
    # every worker routes both versions (v2 /ready answers for the live version, so it does not say this)
    for i in range(2):
        wait_until(lambda: sorted(v["version"] for v in httpx.get(f"{stack.worker_url(i)}/status", timeout=5).json()
                                  ["endpoints"]["clf"]["versions"]) == [1, 2], 60, f"the canary routed on worker {i}")
    wait_until(lambda: all(stack.revision(i) == stack.revision(0) for i in range(2)), 5, "workers in step")
    versions = []
    for i in range(2):  # both workers, 1,000 requests each
        versions += asyncio.run(_versions(f"{stack.worker_url(i)}/serve/clf", 1000))
    counts = collections.Counter(versions)
    share = counts["2"] / len(versions)
    assert set(counts) == {"1", "2"}
    assert abs(share - 0.10) <= 0.025, counts
    print(f"\ncanary share of version 2 over {len(versions)} requests: {share:.4f} ({dict(counts)})")
    # The bound is ~7 standard deviations; the share must also be plausible for p=0.1 itself.
    assert binomtest(counts["2"], len(versions), 0.10).pvalue > 1e-4
    for key in ("user-1", "user-2", "user-3", "user-42"):
        seen = {v for i in range(2) for v in asyncio.run(_versions(f"{stack.worker_url(i)}/serve/clf", 20, 4, key))}
        assert len(seen) == 1, f"routing key {key} went to versions {seen}"


def test_config_change_reaches_every_worker_at_once(stack):
    """Commit to both workers' processes, printed (a few tens of ms on a quiet machine). That the commit
    itself pushes it is proven without a clock in tests/registry/test_config_stream.py; the bound here is
    loose because the suite runs on a saturated machine, where a 1 s bound is a coin toss."""
    before = httpx.get(f"{stack.control_plane}/health").json()["revision"]
    t0 = time.monotonic()
    stack.cli("canary", "set", "--endpoint", "clf", "--weights", "1=50,2=50")
    cli_done = time.monotonic()
    target = httpx.get(f"{stack.control_plane}/health").json()["revision"]
    assert target == before + 1
    wait_until(lambda: all(stack.revision(i) >= target for i in range(2)), 5.0, "both workers at the new revision",
               interval=0.01)
    # The CLI process itself takes a while to start; what is measured is commit -> workers.
    lag = time.monotonic() - cli_done
    assert lag < 5.0, f"cli took {cli_done - t0:.2f}s"
    print(f"\nconfig change visible on both workers {lag * 1000:.0f} ms after the CLI returned")


def test_worker_restarted_while_control_plane_down_serves_last_config(stack, tiny_model):
    stack.cli("canary", "rollback", "--endpoint", "clf")
    target = httpx.get(f"{stack.control_plane}/health").json()["revision"]
    wait_until(lambda: stack.revision(1) >= target, 2, "worker 1 has the rollback")
    stack.stop("control-plane")
    stack.stop("worker1")
    stack.start_worker(1)
    assert stack.revision(1) == target
    r = httpx.post(f"{stack.worker_url(1)}/serve/clf", json={"text": TEXT}, timeout=30)
    assert r.status_code == 200 and r.headers["X-Model-Version"] == "1"
    np.testing.assert_allclose(r.json()["logits"], reference_logits(tiny_model, [TEXT])[0], atol=1e-4)
    # The control plane comes back: workers reconnect on their own and follow new changes.
    stack.start_control_plane()
    stack.cli("model", "add", "--endpoint", "clf", "--model", "clf:2", "--canary", "20%")
    target = httpx.get(f"{stack.control_plane}/health").json()["revision"]
    wait_until(lambda: all(stack.revision(i) >= target for i in range(2)), 10, "workers follow the restarted control plane")

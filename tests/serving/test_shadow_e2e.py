"""Shadow traffic end to end, real processes on real sockets: control plane, `serving worker`
(onnxruntime engine, built-in tokenizer), statistics service and a real Prometheus scraping it,
driven through the `serving` CLI.

* 30% shadow over 1,000 requests: the copies the statistics service counted (run + dropped) are
  within 4.5 binomial standard deviations of 300 (|C - 300| <= 65), and a two-sided binomial test
  does not reject p = 0.3 at 1e-4;
* 100% over 200 requests: exactly 200 copies;
* every client answer is the live version's: X-Model-Version 1 and logits equal to onnxruntime
  run directly on the live model, never the shadow's (the two models' logits differ);
* the live series count only live requests (version 1), and the agreement series reach
  Prometheus with exactly the agreement computed from the two models directly.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import onnxruntime as ort
import pytest
from scipy.stats import binomtest
from transformers import AutoTokenizer

from serving.testmodels import build_bert_classifier
from tests.serving.stack import Stack, make_stack
from tests.serving.statistics.support import Prometheus, prometheus
from tests.support.procs import wait_until

EP = "shadow-e"
TEXTS = ["fine", "the staff were friendly and quick", "an awful slow and noisy place", "calm and bright",
         "bad", "a somewhat longer sentence about the weather and the sea", "rude late broken", "superb"]
N_PARTIAL, SHARE, N_FULL = 1000, 0.30, 200


def logits_of(bundle, texts: list[str]) -> np.ndarray:
    """One text at a time, as the worker runs them (no padding to a batch's longest text)."""
    tok = AutoTokenizer.from_pretrained(str(bundle.tokenizer_dir))
    sess = ort.InferenceSession(str(bundle.onnx_path), providers=["CPUExecutionProvider"])
    rows = []
    for text in texts:
        enc = tok([text], truncation=True, max_length=128, return_tensors="np")
        rows.append(sess.run(["logits"], {i.name: enc[i.name].astype(np.int64) for i in sess.get_inputs()})[0][0])
    return np.stack(rows)


@pytest.fixture(scope="module")
def shadow_model(tmp_path_factory):
    return build_bert_classifier(tmp_path_factory.mktemp("tiny-bert-shadow-e2e"), seed=1)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, tiny_model, shadow_model):
    s = make_stack(tmp_path_factory.mktemp("shadow-stack"), workers=1)
    s.env["SERVING_STATISTICS_HOST"] = "127.0.0.1"
    try:
        s.start_components()
        s.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
        s.cli("model", "upload", "--name", "clf", "--path", str(shadow_model.onnx_path))
        s.cli("model", "add", "--endpoint", EP, "--model", "clf:1", "--engine", "onnxruntime",
              "--tokenizer", str(tiny_model.tokenizer_dir), "--labels", ",".join(tiny_model.labels))
        yield s
    finally:
        s.stop_all()


@pytest.fixture(scope="module")
def prom(stack: Stack, tmp_path_factory) -> Prometheus:
    with prometheus(tmp_path_factory.mktemp("shadow-prometheus"),
                    [f"127.0.0.1:{stack.env['SERVING_STATISTICS_PORT']}"]) as p:
        p.wait_value('up{job="serving-statistics"}', 1.0, timeout=30)
        yield p


def wait_shadow(stack: Stack, percent: float) -> None:
    def has_it() -> bool:
        status = httpx.get(f"{stack.worker_url(0)}/status", timeout=5).json()
        versions = status["endpoints"].get(EP, {}).get("versions", [])
        return {"version": 2, "weight": percent} in versions
    wait_until(has_it, timeout=60, interval=0.1, what=f"the worker shadows {EP} at {percent}%")
    ready = f"{stack.worker_url(0)}/v2/models/{EP}/ready"
    wait_until(lambda: httpx.get(ready, timeout=5).status_code == 200, timeout=60, what="both versions loaded")


def send(stack: Stack, n: int, live: np.ndarray) -> list[int]:
    """n requests over 4 connections; every answer must be the live model's. Returns text indices."""
    url = f"{stack.worker_url(0)}/serve/{EP}"

    def one(client: httpx.Client, i: int) -> int:
        j = i % len(TEXTS)
        r = client.post(url, json={"text": TEXTS[j]})
        assert r.status_code == 200, r.text
        assert r.headers["X-Model-Version"] == "1"
        np.testing.assert_allclose(r.json()["logits"], live[j], atol=1e-4)
        return j

    def chunk(k: int) -> list[int]:
        with httpx.Client(timeout=30) as client:
            return [one(client, i) for i in range(k, n, 4)]

    with ThreadPoolExecutor(4) as pool:
        return [j for part in pool.map(chunk, range(4)) for j in part]


def settled(prom: Prometheus, expr: str, quiet_s: float = 3.0, timeout: float = 60.0) -> float:
    """The value of ``expr`` once it stopped changing for ``quiet_s`` (copies run after the answers)."""
    deadline, last, since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        value = prom.scalar(expr)
        if value != last:
            last, since = value, time.monotonic()
        elif value is not None and time.monotonic() - since >= quiet_s:
            return value
        time.sleep(0.25)
    raise TimeoutError(f"{expr} did not settle: last {last}")


COPIES = (f'sum(serving_shadow_requests_total{{endpoint="{EP}"}}) '
          f'+ (sum(serving_shadow_dropped_total{{endpoint="{EP}"}}) or vector(0))')


@pytest.mark.timeout(300)
def test_shadow_share_answers_and_agreement(stack: Stack, prom: Prometheus, tiny_model, shadow_model) -> None:
    live, other = logits_of(tiny_model, TEXTS), logits_of(shadow_model, TEXTS)
    assert np.abs(live - other).mean(axis=1).min() > 1e-3, "the two models must answer differently"
    agree = np.argmax(live, axis=1) == np.argmax(other, axis=1)
    mad = np.abs(live - other).mean(axis=1)

    # --- 30% of 1,000 requests ---------------------------------------------------------
    stack.cli("model", "add", "--endpoint", EP, "--model", "clf:2", "--shadow", "30%")
    wait_shadow(stack, 30.0)
    send(stack, N_PARTIAL, live)
    prom.wait_value(f'sum(serving_requests_total{{endpoint="{EP}"}})', float(N_PARTIAL), timeout=30)
    copies = settled(prom, COPIES)
    sigma = (N_PARTIAL * SHARE * (1 - SHARE)) ** 0.5
    print(f"30% shadow: {copies:.0f} copies of {N_PARTIAL} requests (expected {N_PARTIAL * SHARE:.0f} "
          f"+- {4.5 * sigma:.0f} at 4.5 sigma)")
    assert abs(copies - N_PARTIAL * SHARE) <= 4.5 * sigma, copies
    assert binomtest(int(copies), N_PARTIAL, SHARE).pvalue > 1e-4
    # the live series hold the live requests only
    assert prom.scalar(f'count(serving_requests_total{{endpoint="{EP}"}})') == 1.0
    assert prom.scalar(f'sum(serving_requests_total{{endpoint="{EP}", version="1", status="200"}})') == N_PARTIAL
    assert prom.scalar(f'sum(serving_request_latency_seconds_count{{endpoint="{EP}"}})') == N_PARTIAL
    ran = prom.scalar(f'sum(serving_shadow_requests_total{{endpoint="{EP}", version="2", status="200"}})')
    assert ran == prom.scalar(f'sum(serving_shadow_latency_seconds_count{{endpoint="{EP}", version="2"}})')
    agreed_before = prom.scalar(f'sum(serving_shadow_label_agreement_total{{endpoint="{EP}", agree="true"}})')
    compared_before = prom.scalar(f'sum(serving_shadow_label_agreement_total{{endpoint="{EP}"}})')
    assert compared_before == ran
    mad_before = prom.scalar(f'sum(serving_shadow_logit_mad_sum{{endpoint="{EP}"}})')

    # --- 100% of 200 requests: exactly one copy each; agreement known exactly -------------
    stack.cli("canary", "shadow", "--endpoint", EP, "--model", "clf:2", "--percent", "100%")
    wait_shadow(stack, 100.0)
    sent = send(stack, N_FULL, live)
    prom.wait_value(f'sum(serving_requests_total{{endpoint="{EP}"}})', float(N_PARTIAL + N_FULL), timeout=30)
    assert settled(prom, COPIES) == copies + N_FULL
    agreed = prom.scalar(f'sum(serving_shadow_label_agreement_total{{endpoint="{EP}", agree="true"}})')
    compared = prom.scalar(f'sum(serving_shadow_label_agreement_total{{endpoint="{EP}"}})')
    assert compared - compared_before == N_FULL
    assert agreed - agreed_before == sum(agree[j] for j in sent)
    mad_sum = prom.scalar(f'sum(serving_shadow_logit_mad_sum{{endpoint="{EP}"}})') - mad_before
    assert mad_sum == pytest.approx(sum(mad[j] for j in sent), rel=1e-3)
    rate = prom.scalar(f'sum(serving_shadow_label_agreement_total{{endpoint="{EP}", agree="true"}}) / '
                       f'sum(serving_shadow_label_agreement_total{{endpoint="{EP}"}})')
    print(f"agreement in Prometheus: {agreed:.0f}/{compared:.0f} = {rate:.3f} (per text: {agree.tolist()}); "
          f"mean |logit diff| of the 100% run {mad_sum / N_FULL:.4f} (direct: {np.mean([mad[j] for j in sent]):.4f})")

    # --- off: no more copies ----------------------------------------------------------------
    stack.cli("canary", "shadow", "--endpoint", EP, "--off")
    wait_until(lambda: len(httpx.get(f"{stack.worker_url(0)}/status", timeout=5).json()["endpoints"][EP]["versions"])
               == 1, timeout=30, what="shadow removed")
    send(stack, 20, live)
    prom.wait_value(f'sum(serving_requests_total{{endpoint="{EP}"}})', float(N_PARTIAL + N_FULL + 20), timeout=30)
    assert settled(prom, COPIES, quiet_s=2.0) == copies + N_FULL

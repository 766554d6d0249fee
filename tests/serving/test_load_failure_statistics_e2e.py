"""A version that cannot be loaded shows in Prometheus (issue 19, item 1), real processes on loopback.

The control plane, the statistics service, two `serving worker` processes (the tokenizer; on
onnxruntime, or on the embedded Triton) and Debian's Prometheus started from the shipped config and
alert rules (1 s scrapes). A corrupt version (the readiness test's broken ONNX) is deployed over a
working one: on onnxruntime each worker process counts its failed attempt, so PromQL reads exactly
2 failures; on Triton the embedded Triton, which loads it, counts it once (it retries every 2 s,
counting again only a new error). Either way the version is not ready,
the alert goes pending, and the old version keeps answering 200 on both processes. A good version
deployed next is ready, and the versions it replaced (the failed one, the old one) stop being exported.
"""
from __future__ import annotations

import time

import httpx
import pytest

from tests.serving.statistics.support import prometheus
from tests.serving.test_readiness_e2e import broken_onnx, show_logs, start_stack
from tests.support.procs import wait_until

TEXT = {"text": "the old version keeps answering"}
FAILED_LOADS = {"onnxruntime": 2.0, "triton": 1.0}  # two worker processes / the one embedded Triton


def failures(ep: str, engine: str) -> str:
    return (f'serving_model_load_failures_total{{endpoint="{ep}", model="clf", version="2", '
            f'engine="{engine}", reason="model"}}')


def ready(ep: str, version: int) -> str:
    return f'serving_model_ready{{endpoint="{ep}", model="clf", version="{version}"}}'


@pytest.mark.timeout(420)
def test_a_corrupt_version_is_counted_in_prometheus_while_the_old_one_answers(tmp_path, tiny_model):
    """One stack for both engines, one after the other: an endpoint on onnxruntime, then one on Triton."""
    t0 = time.monotonic()
    stack = start_stack(tmp_path / "home", triton=True)
    timings = {"stack up s": round(time.monotonic() - t0, 1)}
    try:
        with prometheus(tmp_path / "prometheus", [f"127.0.0.1:{stack.env['SERVING_STATISTICS_PORT']}"]) as prom:
            prom.wait_value('up{job="serving-statistics"}', 1.0, timeout=30)
            # versions 1 and 3 work, 2 cannot be loaded; all uploaded first: an upload changes the config
            # too, and each config change while 2 is deployed would be another attempt (counted)
            for path in (tiny_model.onnx_path, broken_onnx(tiny_model, tmp_path / "bad.onnx"), tiny_model.onnx_path):
                stack.cli("model", "upload", "--name", "clf", "--path", str(path))
            for engine in ("onnxruntime", "triton"):
                t1 = time.monotonic()
                corrupt_version_then_a_good_one(stack, prom, tiny_model, engine)
                timings[f"{engine} s"] = round(time.monotonic() - t1, 1)
    except BaseException:
        show_logs(stack)
        raise
    finally:
        stack.stop_all()
    timings["total s"] = round(time.monotonic() - t0, 1)
    print(timings)


def corrupt_version_then_a_good_one(stack, prom, tiny_model, engine: str) -> None:
    ep = f"le-{engine}"
    FAILURES, expected = failures(ep, engine), FAILED_LOADS[engine]
    add = ("model", "add", "--endpoint", ep, "--engine", engine, "--tokenizer", str(tiny_model.tokenizer_dir))
    stack.cli(*add, "--model", "clf:1", "--wait")
    assert prom.wait_value(ready(ep, 1), 1.0) == 1.0

    res = stack.cli(*add, "--model", "clf:2", "--wait", "--wait-timeout", "60", check=False)
    assert res.returncode == 1 and "failed" in res.stdout, (res.returncode, res.stdout, res.stderr)
    # read back from Prometheus: one failed attempt in each worker process, or Triton's one
    assert prom.wait_value(FAILURES, expected) == expected
    assert [r["metric"]["reason"] for r in prom.query(f'serving_model_load_failures_total{{endpoint="{ep}"}}')] \
        == ["model"]  # that series alone: no error text in any label
    assert prom.scalar(ready(ep, 2)) == 0.0
    assert prom.scalar(ready(ep, 1)) == 1.0  # out of the config, but still the route that answers
    for i in (0, 1):  # the old version keeps answering on both processes
        r = httpx.post(f"{stack.worker_url(i)}/serve/{ep}", json=TEXT, timeout=30)
        assert r.status_code == 200 and r.headers["X-Model-Version"] == "1", (i, r.status_code, r.text)
    alert = f'ALERTS{{alertname="ServingModelLoadFailing", endpoint="{ep}", model="clf", version="2"}}'
    assert prom.wait_value(alert[:-1] + ', alertstate="pending"}', 1.0) == 1.0  # its 1 minute has not elapsed
    time.sleep(3)  # more scrapes (and Triton's retries): the count stays exact
    assert prom.scalar(FAILURES) == expected

    # a good version next: ready; the workers retire 1 and 2, so their readiness and the alert go
    stack.cli(*add, "--model", "clf:3", "--wait")
    assert prom.wait_value(ready(ep, 3), 1.0) == 1.0
    wait_until(lambda: not prom.query(ready(ep, 2)) and not prom.query(ready(ep, 1)) and not prom.query(alert), 20,
               "the readiness of the retired versions and the alert to go")
    assert prom.scalar(FAILURES) == expected  # counters stay
    r = httpx.post(f"{stack.worker_url(0)}/serve/{ep}", json=TEXT, timeout=30)
    assert r.status_code == 200 and r.headers["X-Model-Version"] == "3"

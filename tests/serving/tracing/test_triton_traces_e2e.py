"""One trace holds the worker's spans and Triton's: the embedded Triton (the real tritonserver 2.51 of
nvidia-pytriton, in its OpenTelemetry trace mode) continues the worker's trace from the traceparent
the worker puts in the request's gRPC metadata, and both export over OTLP/HTTP to one receiver (made
with OpenTelemetry's protobuf definitions: no Collector can be installed here, tests/support/otlp.py)."""
from __future__ import annotations

import httpx
import pytest

from tests.serving.stack import make_stack
from tests.support.otlp import Receiver
from tests.support.procs import wait_until

TRACE = "0af7651916cd43dd8448eb211c80319c"
GOOD = f"00-{TRACE}-b7ad6b7169203331-01"
pytestmark = pytest.mark.timeout(300)
EXPECTED = {("serving-worker", "engine"), ("triton", "InferRequest"), ("triton", "clf_v1"), ("triton", "compute")}


def test_tritons_spans_join_the_workers_trace(tmp_path, tiny_model):
    with Receiver() as receiver:
        stack = make_stack(tmp_path / "home", workers=1)
        stack.env["SERVING_TRACING_OTLP_ENDPOINT"] = receiver.url
        try:
            stack.start_components(statistics=False, triton=True)
            stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
            stack.cli("model", "add", "--endpoint", "clf", "--model", "clf", "--engine", "triton",
                      "--tokenizer", str(tiny_model.tokenizer_dir), "--labels", ",".join(tiny_model.labels), "--wait")
            r = httpx.post(f"{stack.worker_url()}/serve/clf", json={"text": "traced through triton"},
                           headers={"traceparent": GOOD}, timeout=60)
            assert r.status_code == 200, r.text

            def joined():  # every span the assertions read: each exporter sends its spans as they end,
                got = receiver.trace(TRACE)  # Triton's one by one (its request span last), the worker's in batches
                return got if EXPECTED <= {(s.service, s.name) for s in got} else None
            spans = wait_until(joined, 30, "the worker's and Triton's spans in one trace",
                               on_timeout=lambda: str([(s.service, s.name, s.parent_id) for s in receiver.spans]))
        finally:
            stack.stop_all()
    engine = next(s for s in spans if s.service == "serving-worker" and s.name == "engine")
    triton = {s.name: s for s in spans if s.service == "triton"}
    # Triton's request span hangs from the worker's engine span; its model's and compute's from it
    assert triton["InferRequest"].parent_id == engine.span_id, [(s.name, s.parent_id) for s in triton.values()]
    assert triton["clf_v1"].parent_id == triton["InferRequest"].span_id
    assert triton["compute"].parent_id == triton["clf_v1"].span_id

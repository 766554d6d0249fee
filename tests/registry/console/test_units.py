"""The console's parts without a browser: reading /metrics, the charts, sessions and CSRF, the
playground's upload form and how it shows answers."""
from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest
from starlette.requests import Request

from registry.console.charts import line_chart
from registry.console.playground import raw_body, readable, size_words
from registry.console.stats import Figures, Statistics, between, parse
from registry.console.web import Upload, UploadTooLarge, read_upload_form

METRICS = """\
# TYPE serving_requests counter
serving_requests_total{endpoint="e",version="1",status="200"} 8
serving_requests_total{endpoint="e",version="1",status="500"} 2
serving_requests_total{endpoint="e",version="2",status="200"} 5
# TYPE serving_request_latency_seconds histogram
serving_request_latency_seconds_bucket{endpoint="e",version="1",le="0.01"} 4
serving_request_latency_seconds_bucket{endpoint="e",version="1",le="0.1"} 10
serving_request_latency_seconds_bucket{endpoint="e",version="1",le="+Inf"} 10
serving_request_latency_seconds_count{endpoint="e",version="1"} 10
serving_request_latency_seconds_sum{endpoint="e",version="1"} 0.3
# TYPE serving_drift_psi gauge
serving_drift_psi{endpoint="e",version="1",variable="a"} 0.05
serving_drift_psi{endpoint="e",version="1",variable="b"} 0.3
serving_drift_psi{endpoint="e",version="2",variable="a"} NaN
# TYPE serving_shadow_label_agreement counter
serving_shadow_label_agreement_total{endpoint="e",version="2",agree="true"} 3
serving_shadow_label_agreement_total{endpoint="e",version="2",agree="false"} 1
# TYPE serving_llm_inter_token_latency_seconds histogram
serving_llm_inter_token_latency_seconds_bucket{endpoint="e",version="2",le="0.05"} 7
serving_llm_inter_token_latency_seconds_bucket{endpoint="e",version="2",le="+Inf"} 9
"""


def test_metrics_are_read_per_version():
    got = parse(METRICS)
    v1, v2 = got[("e", "1")], got[("e", "2")]
    assert (v1.requests, v1.errors, v1.error_rate) == (10, 2, 0.2)
    assert v1.latency == {0.01: 4, 0.1: 10, math.inf: 10}
    assert v1.percentile(0.5) == 0.01 + (0.1 - 0.01) * (5 - 4) / (10 - 4)
    assert v1.max_drift == 0.3 and v2.drift == {}
    assert (v2.requests, v2.agreement) == (5, 0.75)
    assert v2.itl == {0.05: 7, math.inf: 9} and v1.itl == {}


def test_a_window_is_the_difference_of_two_reads():
    start = Figures(requests=10, errors=1, latency={0.1: 10, math.inf: 10})
    end = Figures(requests=30, errors=2, latency={0.1: 20, math.inf: 30})
    p = between(start, end, 10.0, at=100.0)
    assert (p.rate, p.errors) == (2.0, 1)
    assert p.p50_ms == 100.0  # half of the 20 new requests were over 0.1 s: the +Inf bucket's lower edge
    assert p.ttft_p99_ms is None and p.itl_p99_ms is None and p.tokens_per_s is None  # not an LLM


def test_rates_come_from_the_kept_samples():
    clock = iter([0.0, 60.0]).__next__
    stats = Statistics("http://nowhere", clock=clock)
    stats.samples.extend([(0.0, {("e", "1"): Figures(requests=0)}), (60.0, {("e", "1"): Figures(requests=120)})])
    assert stats.rate(("e", "1")) == 2.0
    assert stats.rate(("e", "9")) is None


def test_a_chart_draws_each_version_and_says_it_in_words():
    svg = str(line_chart("Requests <all>", "req/s", {"v1": [(0, 1.0), (10, 2.0)], "v2": [(0, None), (10, 4.0)]}, 0, 10))
    assert svg.count("<path") == 2 and "&lt;all&gt;" in svg and "<all>" not in svg
    assert "v1: last 2 req/s; v2: last 4 req/s" in svg
    assert "<figcaption>" in svg  # nothing of the markup escaped


def multipart_request(fields: dict, files: dict, chunk: int = 1000, declare: bool = True) -> Request:
    """A Starlette request carrying the multipart form a browser sends, its body in ``chunk``-byte
    messages, with or without its Content-Length."""
    built = httpx.Request("POST", "http://console/playground/upload", data=fields, files=files)
    body = built.read()
    headers = [(k.lower().encode(), v.encode()) for k, v in built.headers.items()
               if declare or k.lower() != "content-length"]
    parts = [body[i:i + chunk] for i in range(0, len(body), chunk)] or [b""]
    messages = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/playground/upload", "headers": headers,
                    "query_string": b""}, receive)


def test_an_upload_form_gives_its_fields_and_the_files_bytes_unchanged():
    data = bytes(range(256)) * 8
    req = multipart_request({"csrf": "t", "input": "typed"}, {"file": ("a.png", data, "image/png")})
    fields, files = asyncio.run(read_upload_form(req, 10_000))
    assert fields == {"csrf": "t", "input": "typed"}
    assert files == {"file": Upload("a.png", "image/png", data)}


@pytest.mark.parametrize("declare", [True, False])
def test_an_upload_past_its_limit_is_refused_declared_or_not(declare):
    req = multipart_request({"csrf": "t"}, {"file": ("a.bin", b"x" * 5000, "application/octet-stream")},
                            declare=declare)
    with pytest.raises(UploadTooLarge) as refused:
        asyncio.run(read_upload_form(req, 4000))
    assert refused.value.size > 5000 and refused.value.limit == 4000  # read to its end: the browser sees why


def test_the_file_wins_over_the_text_box_and_the_text_box_is_typed_by_its_content():
    chosen = {"file": Upload("cat.png", "image/png", b"\x89PNG")}
    none_chosen = {"file": Upload("", "application/octet-stream", b"")}  # what a browser sends then
    assert raw_body(chosen, "ignored").data == b"\x89PNG"
    assert raw_body(chosen, "").content_type == "image/png"
    assert raw_body(none_chosen, '{"a": 1}').content_type == "application/json"
    assert raw_body(none_chosen, "héllo").content_type == "text/plain; charset=utf-8"
    assert raw_body(none_chosen, "héllo").data == "héllo".encode()
    assert raw_body(none_chosen, "") is None and raw_body({}, "") is None
    assert raw_body({"file": Upload("empty.bin", "", b"")}, "x").content_type == "application/octet-stream"


def test_an_answer_shows_as_json_text_or_its_size():
    assert json.loads(readable(b'{"a":[1,2]}', "text/plain")) == {"a": [1, 2]}
    assert readable(b'{"a":1}', "application/json") == '{\n  "a": 1\n}'
    assert readable("tschüss".encode(), "text/plain; charset=utf-8") == "tschüss"
    assert readable(b"\x89PNG\r\n\x1a\n\0\0", "image/png") == "10 bytes of image/png"
    assert readable(b"plain ascii", "image/png") == "11 bytes of image/png"
    assert readable(b"\xff\xfe", "") == "2 bytes of an unnamed content type"
    assert readable(b"", "") == "(an empty body)"
    assert size_words(1_048_576) == "1,048,576 bytes (1 MiB)" and size_words(999) == "999 bytes"


def test_the_workers_page_shows_an_engine_scaled_to_zero_one_waking_and_the_last_cold_start():
    """The launcher's readiness report (kind llm) carries each engine's state (serving/llm/kube/engines.py
    ``readiness``); the page says it in words. Rendered from the template as the console does."""
    from jinja2 import Environment, FileSystemLoader

    from registry.console.app import HERE
    from registry.readiness import ReadinessReport

    report = ReadinessReport.model_validate({"source": "llm-1", "kind": "llm", "engines": {
        "chat:1": {"state": "scaled_to_zero", "scale_to_zero_after_s": 300, "cold_start_s": 27.4},
        "chat:2": {"state": "starting", "waking": True, "scale_to_zero_after_s": 60},
        "big:1": {"state": "ready", "replicas": 2}}})
    env = Environment(loader=FileSystemLoader(str(HERE / "templates")), autoescape=True)
    html = env.get_template("workers.html").render(session=None, flash=None, revision=3, page="workers",
                                                    reports=[{**report.model_dump(), "age_s": 1.0}])
    text = " ".join(html.split())
    assert "engine chat:1: <strong class=\"engine-state\">scaled to zero</strong>; to zero after 300 s idle; " \
           "last cold start 27.4 s" in text
    assert "engine chat:2: <strong class=\"engine-state\">starting</strong> (waking); to zero after 60 s idle" in text
    assert "engine big:1: <strong class=\"engine-state\">ready</strong>, 2 replicas" in text

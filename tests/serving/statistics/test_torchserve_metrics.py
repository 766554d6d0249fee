"""TorchServe's metric names from requests' ``torchserve`` event objects, and a handler's custom metrics
(the lines TorchServe's metric objects write) exposed under the handler's names."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from serving.statistics.events import parse_event
from serving.statistics.pipeline import StatisticsPipeline
from serving.statistics.torchserve_events import parse_metric_line, parse_torchserve

LINES = ["[METRICS]ImagesSeen.Count:3|#ModelName:mnist,Level:Model|#type:COUNTER|#hostname:h,1700000000,req-1",
         "[METRICS]Temperature.C:7.5|#ModelName:mnist|#type:GAUGE|#hostname:h,1700000000",
         "[METRICS]Spread.ms:2|#ModelName:mnist|#type:HISTOGRAM|#hostname:h,1700000000"]


def _event(lines=LINES, version=1, queue_s=0.002, latency_s=0.01):
    return {"endpoint": "mnist", "version": version, "status": 200, "latency_s": latency_s,
            "torchserve": {"batch": 2, "queue_s": queue_s, "handler_s": 0.005, "hostname": "w1", "metrics": lines}}


def _samples(registry: CollectorRegistry) -> dict[tuple[str, frozenset], float]:
    text = generate_latest(registry).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_line_is_read_as_torchserve_writes_it():
    metric = parse_metric_line(LINES[0])
    assert (metric.name, metric.unit, metric.value, metric.kind) == ("ImagesSeen", "Count", 3.0, "COUNTER")
    assert dict(metric.dimensions) == {"ModelName": "mnist", "Level": "Model"}
    for bad in ("plain log line", "[METRICS]x.u:nan|#|#type:COUNTER", "[METRICS]x.u:1|#|#type:SUMMARY", 7):
        assert parse_metric_line(bad) is None
    assert parse_torchserve({"batch": "x", "queue_s": -1, "metrics": "no"}).batch == 1


def test_ts_names_and_custom_metrics_reach_prometheus():
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    for _ in range(2):
        pipeline.handle_event(parse_event(_event()))
    pipeline.handle_event(parse_event(_event(lines=[], version=2, queue_s=0.001, latency_s=0.02)))
    got = _samples(registry)
    v1 = frozenset({"model_name": "mnist", "model_version": "1", "hostname": "w1"}.items())
    assert got[("ts_inference_requests_total", v1)] == 2
    assert got[("ts_inference_latency_microseconds", v1)] == 20000
    assert got[("ts_queue_latency_microseconds", v1)] == 4000
    v2 = frozenset({"model_name": "mnist", "model_version": "2", "hostname": "w1"}.items())
    assert got[("ts_inference_requests_total", v2)] == 1
    mine = {"ModelName": "mnist", "endpoint": "mnist", "version": "1"}
    assert got[("ImagesSeen", frozenset({**mine, "Level": "Model"}.items()))] == 6  # a counter adds up
    assert got[("Temperature", frozenset(mine.items()))] == 7.5  # a gauge keeps its last value
    assert got[("Spread_sum", frozenset(mine.items()))] == 4 and got[("Spread_count", frozenset(mine.items()))] == 2


def test_other_dimensions_or_a_platform_name_never_break_the_scrape():
    registry = CollectorRegistry()
    pipeline = StatisticsPipeline(registry)
    lines = [LINES[0], "[METRICS]ImagesSeen.Count:1|#Other:x|#type:COUNTER|#hostname:h,1",
             "[METRICS]serving_requests.Count:1|#ModelName:m|#type:COUNTER|#hostname:h,1"]
    pipeline.handle_event(parse_event(_event(lines=lines)))
    got = _samples(registry)  # parses: one family per name, no duplicate of the platform's series
    assert [k for k in got if k[0] == "ImagesSeen"] == [("ImagesSeen", frozenset(
        {"ModelName": "mnist", "Level": "Model", "endpoint": "mnist", "version": "1"}.items()))]
    assert any(name == "handler_serving_requests" for name, _ in got)

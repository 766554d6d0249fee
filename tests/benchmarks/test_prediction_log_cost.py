"""benchmarks.prediction_log_cost's own logic (with its plan and CPU-clock modules): the interleaved order and the ratios it yields (a linear
drift of the machine cancels), the off-against-off noise, the variant table (one worker per environment,
a new variant in one line), the sink-down arithmetic, and a small real run of the CPU-clock part on the
real request path and files sink. The benchmark's figures are not checked here
(benchmarks/results/prediction-log-cost.json holds them)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import prediction_log_cost as cost, prediction_log_cpu as cpu, prediction_log_plan as plans

OFF = plans.BASELINE


def test_schedule_runs_each_variant_twice_between_offs_and_reverses_every_other_round() -> None:
    assert plans.schedule([OFF, "a", "b"], 2) == [
        (0, OFF), (0, "a"), (0, "a"), (0, OFF), (0, "b"), (0, "b"), (0, OFF),
        (1, "b"), (1, "b"), (1, OFF), (1, "a"), (1, "a"), (1, OFF)]
    plan = plans.schedule([v["name"] for v in plans.VARIANTS], 2)
    assert len(plan) == 1 + 2 * 3 * (len(plans.VARIANTS) - 1)
    for i, (_, name) in enumerate(plan):  # every variant run has an off run within two runs on both sides
        if name != OFF:
            assert OFF in [n for _, n in plan[max(0, i - 2):i]] and OFF in [n for _, n in plan[i + 1:i + 3]]


def _runs(factors: dict[str, float], rounds: int, drift) -> list[dict]:
    plan = plans.schedule(list(factors), rounds)
    return [{"round": r, "variant": name, "rps": factors[name] * drift(i)} for i, (r, name) in enumerate(plan)]


def test_ratios_cancel_a_linear_drift_of_the_machine() -> None:
    factors = {OFF: 1.0, "files-100": 0.99, "kafka-100": 0.95}
    runs = _runs(factors, 3, lambda i: 100.0 - 2.5 * i)  # the box slows by 2.5 req/s a run
    got = plans.ratios(runs)
    assert set(got) == {"files-100", "kafka-100"}
    for name in got:
        assert len(got[name]) == 3
        assert got[name] == pytest.approx([factors[name]] * 3, rel=1e-12)
    # compared with the mean of every off run instead, the drift would show as a difference
    offs = [r["rps"] for r in runs if r["variant"] == OFF]
    first_kafka = [r["rps"] for r in runs if r["variant"] == "kafka-100"][:2]
    assert sum(first_kafka) / 2 / (sum(offs) / len(offs)) != pytest.approx(0.95, abs=0.01)


def test_ratios_use_the_off_runs_beside_each_block_only() -> None:
    runs = [{"variant": OFF, "rps": 100.0}, {"variant": "x", "rps": 90.0}, {"variant": "x", "rps": 94.0},
            {"variant": OFF, "rps": 80.0}, {"variant": "y", "rps": 60.0}, {"variant": "y", "rps": 60.0},
            {"variant": OFF, "rps": 40.0}]
    assert plans.ratios(runs) == {"x": [pytest.approx(92 / 90)], "y": [pytest.approx(60 / 60)]}
    s = plans.spread([0.9, 1.0, 1.1])
    assert (s["mean"], s["min"], s["max"], s["n"]) == (pytest.approx(1.0), 0.9, 1.1, 3)


def test_off_against_off_noise() -> None:
    quiet = _runs({OFF: 1.0, "a": 0.9, "b": 0.8}, 2, lambda i: 100.0)
    noise = plans.baseline_noise(quiet, 2)
    assert noise["run_cv"] == 0 and noise["resolves_mean"] == 0 and noise["pairs"] == [1.0] * 4
    wobbly = _runs({OFF: 1.0, "a": 1.0, "b": 1.0}, 2, lambda i: 100.0 * (1.1 if i % 2 else 1.0))
    noisy = plans.baseline_noise(wobbly, 2)
    assert noisy["run_cv"] > 0.03 and noisy["resolves_one_block"] == pytest.approx(1.96 * noisy["run_cv"])
    assert noisy["resolves_mean"] == pytest.approx(noisy["resolves_one_block"] / math.sqrt(2))


def test_summary_gives_ratios_and_added_cpu_against_off() -> None:
    runs = [{"variant": OFF, "rps": 100.0, "p50_ms": 300.0, "p99_ms": 400.0, "worker_cpu_us": 10_000.0, "errors": 0},
            {"variant": "k", "rps": 98.0, "p50_ms": 310.0, "p99_ms": 420.0, "worker_cpu_us": 10_200.0, "errors": 1},
            {"variant": "k", "rps": 98.0, "p50_ms": 310.0, "p99_ms": 420.0, "worker_cpu_us": 10_200.0, "errors": 0},
            {"variant": OFF, "rps": 100.0, "p50_ms": 300.0, "p99_ms": 400.0, "worker_cpu_us": 10_000.0, "errors": 0}]
    out = cost.summarize(runs, [{"name": OFF, "sample": 0}, {"name": "k", "sample": 100}])
    assert "rps_ratio" not in out[OFF]
    assert out["k"]["rps_ratio"]["mean"] == pytest.approx(0.98)
    assert out["k"]["cpu_ratio"]["mean"] == pytest.approx(1.02)
    assert out["k"]["added_cpu_us"]["mean"] == pytest.approx(200.0)
    assert out["k"]["errors"] == 1 and out["k"]["runs"] == 2


def test_variant_table_one_worker_per_environment_and_a_new_variant_is_one_line() -> None:
    plans.check_variants(plans.VARIANTS)
    names = [v["name"] for v in plans.VARIANTS]
    assert names[:6] == [OFF, "off-b", "files-10", "files-100", "kafka-10", "kafka-100"]
    groups = list(plans.worker_groups(plans.VARIANTS).values())
    assert [OFF] in groups and ["files-10", "files-100"] in groups and ["kafka-10", "kafka-100"] in groups
    assert ["off-b"] in groups, "the A/A control runs off's settings in a second worker process"
    assert ["kafka-down-100"] in groups, "the sink-down worker has its own queue bound"
    tracing = next(v for v in plans.VARIANTS if v["name"] == "tracing-100")
    assert ["tracing-100"] in groups, "tracing runs in a worker of its own"
    assert plans.resolve_env(tracing["env"], {"otlp": "http://127.0.0.1:4318"})["SERVING_TRACING_OTLP_ENDPOINT"] \
        == "http://127.0.0.1:4318"
    with pytest.raises(ValueError, match="otlp"):
        plans.resolve_env(tracing["env"], {"kafka": "127.0.0.1:9092"})
    assert plans.resolve_env(plans.KAFKA, {"kafka": "h:1"})["SERVING_KAFKA_BOOTSTRAP_SERVERS"] == "h:1"
    assert plans.addresses("h:1", "http://o:4318")["otlp"] == "http://o:4318" and "otlp" not in plans.addresses("h:1")
    where = plans.addresses("h:1")
    down = plans.resolve_env(plans.KAFKA_DOWN, where)
    assert down["SERVING_KAFKA_BOOTSTRAP_SERVERS"] == where["closed"] != "h:1"
    assert down["SERVING_PREDICTION_LOG_MAX_QUEUE"] == str(plans.MAX_QUEUE_DOWN)
    full = plans.addresses("h:1", "http://o:4318")
    for v in plans.VARIANTS:  # every shipped variant's environment resolves with what addresses() gives
        assert "{" not in "".join(plans.resolve_env(v["env"], full).values())
    with pytest.raises(ValueError, match="repeat"):
        plans.check_variants([*plans.VARIANTS, plans.VARIANTS[1]])
    with pytest.raises(ValueError, match="off"):
        plans.check_variants(plans.VARIANTS[1:])
    with pytest.raises(ValueError, match="percent"):
        plans.check_variants([*plans.VARIANTS, {"name": "x", "sample": 150, "env": {}}])
    assert [plans.endpoint_for(s) for s in (0, 10, 100, 2.5)] == ["w2-nolog", "w2-log10", "w2-log100", "w2-log2.5"]


def test_drop_check_and_implied_ratio_arithmetic() -> None:
    status = {"sink": "kafka", "queued": 200, "written": 0, "dropped": 869, "sink_error": "SinkError: down"}
    assert plans.drop_check(status, 1069, 200)["exact"] is True
    assert plans.drop_check(status, 1070, 200)["exact"] is False  # one record unaccounted for
    assert plans.drop_check({**status, "written": 1}, 1069, 200)["exact"] is False
    assert plans.drop_check({"queued": 50, "written": 0, "dropped": 0}, 50, 200)["exact"] is True  # under the bound
    # a request to an endpoint that logs 10% may or may not have been offered: no exact expectation then
    assert plans.drop_check(status, 1069, 200, elsewhere=1)["exact"] is False
    share, ratio = plans.implied_ratio(200.0, 100.0, 2)  # 200 µs on 100 req/s over 2 cores: 1% of the machine
    assert share == pytest.approx(0.01) and ratio == pytest.approx(1 / 1.01)


def test_cpu_clocks_on_the_real_request_path_and_files_sink(tmp_path: Path) -> None:
    texts = ["a short text to classify", "another text, somewhat longer than the first one was"]
    off = cpu.request_path_us(texts, 0, 300)
    full = cpu.request_path_us(texts, 100, 300)
    tenth = cpu.request_path_us(texts, 10, 2000)
    assert off["logged"] == 0 and off["per_logged_us"] is None
    assert full["logged"] == 300 and full["per_logged_us"] > off["per_request_us"] > 0
    assert 100 < tenth["logged"] < 300, "about 10% of 2000 request ids are kept"

    from serving.prediction_log.sinks.files import RotatingFiles

    records = cpu.w2_records(texts, 5 * 4)
    assert records[0]["inputs"] == {"text": texts[0]} and records[0]["outputs"] == cpu.W2_ANSWER
    sink = RotatingFiles(tmp_path / "files", "test")
    w = cpu.writer_us(sink, records, batch=5, interval_s=0.01)
    assert w["sink"] == "files" and w["batch"] == 5 and w["records"] == 15 and w["writer_us"] > 0
    lines = [json.loads(line) for f in sorted((tmp_path / "files").glob("*.jsonl")) for line in f.read_text().splitlines()]
    assert [r["request_id"] for r in lines] == [r["request_id"] for r in records], "every record once, in order"


def test_plot_writes_a_png(tmp_path: Path) -> None:
    ratio = {"mean": 0.99, "min": 0.97, "max": 1.01}
    result = {"summary": {OFF: {"rps_mean": 100.0}, "kafka-100": {"rps_ratio": ratio, "cpu_ratio": ratio}}}
    cost.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cost.plot({**result, "noise": {"resolves_mean": 0.04}}, tmp_path / "band.png")  # with the off-against-off band
    assert (tmp_path / "band.png").stat().st_size > 0

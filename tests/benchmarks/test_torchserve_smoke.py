"""benchmarks.torchserve with a few requests: real TorchServe and the platform start, take the same
archive, answer the same, every request is counted with the CPU of each system's parts, the ceiling
runs in both runtimes, and the JSON, markdown and plot are written. No timing assertion (timings
live in benchmarks/); the pieces must not rot. The answer comparison and the targets' arithmetic are
checked on their own below."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks import torchserve as bench
from benchmarks import torchserve_answers, torchserve_cpu
from benchmarks.torchserve_report import summarize
from benchmarks.torchserve_systems import java_and_cli, onnx_option
from tests.support.ci import cannot_run

REQUESTS = 50  # psutil reads CPU in clock ticks (10 ms): a few mnist requests can round to 0


def test_answers_are_compared_as_json_within_the_tolerance() -> None:
    want = json.dumps({"class_1": 0.25, "class_2": 0.125}, indent=2)
    same = torchserve_answers.compare(want, json.dumps({"class_2": 0.125 + 4e-6, "class_1": 0.25}))
    assert same["equal"] and not same["identical"] and math.isclose(same["max_abs_diff"], 4e-6, rel_tol=1e-3)
    assert torchserve_answers.compare(want, want) == {"identical": True, "max_abs_diff": 0.0, "equal": True}
    too_far = torchserve_answers.compare(want, json.dumps({"class_1": 0.25, "class_2": 0.126}))
    assert not too_far["equal"] and "class_2" in too_far["problem"]
    other_class = torchserve_answers.compare(want, json.dumps({"class_1": 0.25, "class_3": 0.125}))
    assert not other_class["equal"] and "keys" in other_class["problem"]
    compare = torchserve_answers.compare
    assert not compare("[7]", "[7, 1]")["equal"] and not compare("7", "true")["equal"]
    assert not compare("not json", "other text")["equal"] and compare("text", "text")["equal"]
    checked = torchserve_answers.check_answers({"a": "[1.0]", "b": "[2.0]"}, {"a": "[1.000002]", "b": "[3.0]"})
    assert not checked["equal"] and checked["problem"].startswith("b:") and math.isclose(checked["max_abs_diff"], 2e-6,
                                                                                         rel_tol=1e-3)


def _level(system: str, clients: int, rps: float) -> dict:
    return {"system": system, "variant": "v", "label": system, "concurrency": clients, "rps": rps, "p50_ms": 1.0,
            "p99_ms": 2.0, "cpu_ms_per_request": 10.0 / rps, "passes_rps": [rps], "foreign_cpu_share": 0.0, "errors": 0}


def test_targets_are_ratios_to_torchserves_best_at_each_client_count() -> None:
    checks = [{"system": "platform-onnx", "variant": "v", "equal": True, "max_abs_diff": 3e-7, "identical": False}]
    result = {"workloads": {"resnet18": {"answers": {"checks": checks}, "levels": [
        _level("torchserve", 1, 20.0), _level("torchserve-1thread", 1, 30.0), _level("platform", 1, 31.0),
        _level("platform-onnx", 1, 61.0), _level("torchserve", 8, 40.0), _level("platform", 8, 50.0)]}}}
    summary = summarize(result)
    rows = {(r["system"], r["concurrency"]): r for r in summary["rows"]}
    assert rows[("platform", 1)]["x_torchserve"] == pytest.approx(1.55)
    assert rows[("platform", 1)]["x_torchserve_any"] == pytest.approx(31 / 30)
    assert rows[("platform", 1)]["cpu_x_torchserve"] == pytest.approx(20 / 31)
    met = {(t["system"], t["clients"]): t["met"] for t in summary["targets"]}
    assert met == {("platform", 1): True, ("platform", 8): False, ("platform-onnx", 1): True}
    checks[0]["equal"] = False  # faster with other answers does not count
    assert not next(t for t in summarize(result)["targets"] if t["system"] == "platform-onnx")["met"]


def test_cpu_between_counts_each_part_and_the_rest_of_the_machine() -> None:
    before = torchserve_cpu.Snapshot({1: ("workers", 1.0), 2: ("handler processes", 5.0)}, 100.0, 0.0, 3.0, 10.0)
    after = torchserve_cpu.Snapshot({1: ("workers", 1.5), 2: ("handler processes", 6.0), 3: ("handler processes", 0.5)},
                           103.0, 0.1, 3.5, 11.0)
    cpu = torchserve_cpu.cpu_between(before, after)
    assert cpu["cpu_s"] == pytest.approx(2.0)
    assert cpu["cpu_s_by_part"] == {"handler processes": 1.5, "workers": 0.5}
    cores = torchserve_cpu.os.cpu_count()
    assert cpu["foreign_cpu_share"] == pytest.approx((3.0 - 2.0 - 0.5) / cores)


@pytest.mark.timeout(240)
def test_a_few_requests_through_every_system(tmp_path: Path) -> None:
    why = java_and_cli()
    if why:
        cannot_run(why)
    onnx = onnx_option() is None
    variants = "w1-b1,p1-h1-b1"
    systems = "torchserve,platform,ceiling" + (",platform-onnx" if onnx else "")
    result = bench.main(["--quick", "--requests", str(REQUESTS), "--workloads", "mnist", "--clients", "2",
                         "--systems", systems, "--variants", variants, "--ceiling-seconds", "0.2",
                         "--ceiling-layouts", "1x1", "--ceiling-batch-sizes", "2", "--ceiling-repeats", "1",
                         "--out", str(tmp_path)])
    data = result["workloads"]["mnist"]
    assert data["failed"] == {}
    levels = {lv["system"]: lv for lv in data["levels"]}
    assert set(levels) == {"torchserve", "platform"} | ({"platform-onnx"} if onnx else set())
    for system, level in levels.items():
        assert (level["requests"], level["errors"], level["concurrency"]) == (REQUESTS, 0, 2), level
        assert level["cpu_ms_per_request"] > 0, level
    assert {"frontend (Java)", "backend workers"} <= set(levels["torchserve"]["cpu_ms_per_request_by_part"])
    assert {"workers", "handler processes"} <= set(levels["platform"]["cpu_ms_per_request_by_part"])
    checks = data["answers"]["checks"]
    assert {(c["system"], c["equal"]) for c in checks} >= {("torchserve", True), ("platform", True),
                                                           ("ceiling", True)}, checks
    assert {c["variant"] for c in checks if c["system"] == "ceiling"} == {"torch", "onnx"}
    assert data["ceiling"]["torch"]["rps"] > 0 and data["ceiling"]["onnx"]["rps"] > 0
    assert any(t["system"] == "platform" and t["clients"] == 2 for t in result["summary"]["targets"])
    assert json.loads((tmp_path / "torchserve.json").read_text())["workloads"]["mnist"]["levels"]
    assert "| mnist | 2 | platform |" in (tmp_path / "torchserve.md").read_text()
    assert (tmp_path / "torchserve.png").read_bytes()[:4] == b"\x89PNG"

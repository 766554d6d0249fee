"""The benchmark command, run as CI runs it: quick mode with a tiny request count.

No timing assertions (timings live in benchmarks/, not in tests): it checks that
every kind of system starts, answers every request without an error, and that
the JSON, markdown and PNG are written.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.corpus import MAX_WORDS, MIN_WORDS, make_corpus
from benchmarks.procs import REPO, child_env
from benchmarks.results import LevelResult, SystemResult, validity
from benchmarks.systems.ceiling import merge

# One variant of each system, and both platform engines, W1 only: the smoke test stays near 2 minutes.
SYSTEMS = "ceiling,fastapi-baseline,triton-tokenizer-batch,platform-triton-batch-1w,platform-ort-1w"
REQUESTS = 8


def test_corpus_is_fixed_by_its_seed_and_within_the_word_range() -> None:
    words = [f"w{i}" for i in range(50)]
    texts = make_corpus(words, 40)
    assert texts == make_corpus(words, 40)
    assert all(MIN_WORDS <= len(t.split()) <= MAX_WORDS for t in texts)
    assert len({len(t.split()) for t in texts}) > 10  # varied lengths, so batching must pad


@pytest.mark.timeout(420)
def test_quick_mode_with_a_tiny_request_count(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--requests", str(REQUESTS), "--workload", "W1",
           "--systems", SYSTEMS, "--out", str(tmp_path)]
    out = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"quick.{ext}").stat().st_size > 0
    assert (tmp_path / "quick.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads((tmp_path / "quick.json").read_text())
    by_system = {r["system"]: r for r in data["results"]}
    assert set(by_system) == set(SYSTEMS.split(","))
    for system, result in by_system.items():
        assert result["status"] == "ok", (system, result["reason"])
        for level in result["levels"]:
            assert level["errors"] == 0 and level["warmup_errors"] == 0, (system, level["first_error"])
        if system != "ceiling":
            assert [lv["requests"] for lv in result["levels"]] == [REQUESTS]
    assert by_system["ceiling"]["ratio_ceiling"] == 1.0
    assert len(by_system["ceiling"]["details"]["repeats_rps"]) == 2  # quick: measured twice, around the others
    assert data["invalid"] == [] or all("beats the ceiling" in p for p in data["invalid"])
    assert by_system["fastapi-baseline"]["ratio_baseline"] == 1.0
    assert "| W1 | platform-ort-1w |" in (tmp_path / "quick.md").read_text()


@pytest.mark.timeout(240)
def test_w0_platform_echo_answers_every_request(tmp_path: Path) -> None:
    """The W0 platform echo (serving up, a model-less custom endpoint, statistics on). LitServe,
    MLServer and BentoML install from PyPI into their own venvs on first use: not in CI time."""
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--requests", str(REQUESTS), "--workload", "W0",
           "--systems", "platform-echo-1w", "--out", str(tmp_path)]
    out = subprocess.run(cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=220)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (result,) = json.loads((tmp_path / "quick.json").read_text())["results"]
    assert result["system"] == "platform-echo-1w" and result["status"] == "ok", result["reason"]
    assert [(lv["requests"], lv["errors"]) for lv in result["levels"]] == [(REQUESTS, 0)]


def _result(system: str, rps: list[float], **details) -> SystemResult:
    levels = [LevelResult(1, 10, 0, 1.0, r, 1.0, 1.0, 1.0, 1.0, batch_size=b) for b, r in enumerate(rps, 1)]
    return SystemResult("W1", system, system, levels=levels, details=details)


def test_ceiling_is_the_best_of_its_repeats_with_their_spread() -> None:
    merged = merge([_result("ceiling", [90.0, 100.0]), _result("ceiling", [95.0, 98.0])])
    assert merged.best_rps == 100.0
    assert merged.details["repeats_rps"] == [100.0, 98.0] and merged.details["spread_rps"] == 2.0
    assert [lv.rps for lv in merged.levels] == [95.0, 100.0]  # each level's best


def test_a_run_is_invalid_when_a_system_beats_the_ceiling_by_more_than_its_spread() -> None:
    ceiling = merge([_result("ceiling", [100.0]), _result("ceiling", [96.0])])  # spread 4
    within = _result("platform-ort-1w", [103.0])
    assert validity([ceiling, within]) == []
    over = _result("platform-ort-2w", [105.0])
    (problem,) = validity([ceiling, within, over])
    assert "platform-ort-2w" in problem and "beats the ceiling" in problem
    optimized = _result("platform-ort-int8-1w", [130.0], upload_options=["--optimize", "int8"])
    assert validity([ceiling, optimized]) == []  # another model: not bounded by this ceiling

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
    assert by_system["fastapi-baseline"]["ratio_baseline"] == 1.0
    assert "| W1 | platform-ort-1w |" in (tmp_path / "quick.md").read_text()

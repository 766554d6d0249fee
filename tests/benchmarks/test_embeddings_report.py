"""benchmarks.embeddings (and its report, benchmarks/embeddings_report.py) without its systems: requests of N sentences as the load generator sends them,
and the ratios, table, markdown and plot from a run's figures, so the report cannot rot. The systems
themselves run in the benchmark only (its own venv for Infinity); numbers are not checked here."""
from __future__ import annotations

import json

from benchmarks import embeddings_report as report
from benchmarks.payloads import encode_all


def test_requests_of_n_consecutive_sentences_cover_the_corpus_as_a_ring():
    texts = [f"t{i}" for i in range(5)]
    bodies = [json.loads(b) for b in encode_all("embeddings:2:minilm", texts)]
    assert [b["input"] for b in bodies] == [["t0", "t1"], ["t2", "t3"], ["t4", "t0"]]
    assert {b["model"] for b in bodies} == {"minilm"} and {b["encoding_format"] for b in bodies} == {"float"}
    assert [json.loads(b)["input"] for b in encode_all("embeddings:1:m", texts[:2])] == [["t0"], ["t1"]]


def _level(system: str, shape: int, clients: int, rps: float) -> dict:
    return {"system": system, "shape": shape, "concurrency": clients, "rps": rps, "sentences_per_s": rps * shape,
            "tokens_per_s": rps * shape * 20.0, "cpu_ms_per_sentence": 1.5, "p50_ms": 5.0, "p99_ms": 9.0, "errors": 0, "warmup_errors": 0}


def test_ratios_table_and_plot(tmp_path):
    result = {"mean_tokens": 20.0, "machine": "test", "date": "now", "command": "python -m benchmarks.embeddings",
              "ceiling": {"sentences_per_s": 100.0, "batch_size": 32, "streams": 2, "intra_op_threads": 1,
                          "cpu_ms_per_sentence": 0.9},
              "systems": {"platform-ort": {"min_cosine": 1.0, "max_abs_diff": 1e-7}, "infinity": {"failed": "x"}},
              "levels": [_level("platform-ort", 1, 8, 50.0), _level("infinity", 1, 8, 40.0),
                         _level("st-fastapi", 1, 8, 25.0), _level("platform-ort", 32, 8, 2.5)]}
    result["ratios"] = report.ratios(result)
    assert result["ratios"] == [
        {"system": "platform-ort", "shape": 1, "clients": 8, "vs_infinity": 1.25, "vs_st_fastapi": 2.0, "vs_best_ceiling": 0.5},
        {"system": "platform-ort", "shape": 32, "clients": 8, "vs_best_ceiling": 0.8}]
    text = report.markdown(result)
    assert "| platform-ort | 1 | 8 | 50.0 | 1000 | 1.50 |" in text and "| infinity | x |" in text
    assert "| ceiling | batch 32 | 2 stream(s) | 100.0 | 2000 | 0.90 |" in text
    report.plot(result, tmp_path / "e.png")
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"


def test_the_ceiling_also_batches_sentences_grouped_by_length(tmp_path):
    """A batch of the sorted corpus pads little, as a server's length-grouping batcher does: without this
    order the platform measured 1.3x "the ceiling"."""
    from benchmarks.systems.embedding_ceiling import by_length
    from serving.testmodels import minilm_dir

    texts = ["one two three four five six seven", "one", "one two three", "one two"]
    (tmp_path / "c.json").write_text(json.dumps(texts))
    out = by_length(tmp_path / "c.json", minilm_dir(), tmp_path / "sorted.json")
    assert json.loads(out.read_text()) == ["one", "one two", "one two three", "one two three four five six seven"]
    row = report.table_rows({"levels": [], "mean_tokens": 20.0, "ceiling": {
        "sentences_per_s": 100.0, "batch_size": 32, "streams": 2, "order": "by length", "cpu_ms_per_sentence": 0.9}})
    assert row == [["ceiling", "batch 32, by length", "2 stream(s)", "100.0", "2000", "0.90", "", "", "0"]]


def test_the_ratio_to_the_ceiling_is_taken_against_the_ceiling_measured_beside_the_level(tmp_path):
    """The box's speed drifts: a level is compared with the ceiling run in its own passes, and the best
    sweep's ratio is shown beside it (the stricter figure)."""
    result = {"mean_tokens": 20.0, "machine": "test", "date": "now", "command": "c", "systems": {},
              "ceiling": {"sentences_per_s": 440.0, "batch_size": 32, "streams": 2, "order": "by length"},
              "ceiling_beside": [{"shape": 32, "clients": 32, "sentences_per_s": 400.0, "passes": [410.0, 390.0]}],
              "levels": [_level("platform-ort", 32, 32, 12.0), _level("platform-ort", 1, 32, 300.0)]}
    result["ratios"] = report.ratios(result)
    assert result["ratios"] == [
        {"system": "platform-ort", "shape": 1, "clients": 32, "vs_best_ceiling": 0.68},
        {"system": "platform-ort", "shape": 32, "clients": 32, "vs_ceiling": 0.96, "vs_best_ceiling": 0.87}]
    assert "| platform-ort | 32 | 32 |  |  | 400.0 | 0.96 | 0.87 |" in report.markdown(result)
    report.plot(result, tmp_path / "e.png")
    assert (tmp_path / "e.png").read_bytes()[:4] == b"\x89PNG"


def test_the_ceiling_child_runs_one_configuration_when_told(tmp_path):
    """Beside each level the benchmark runs only the sweep's best configuration: one level comes back,
    the one asked for."""
    import subprocess
    import sys

    from benchmarks import embeddings
    from benchmarks.procs import REPO, child_env

    (tmp_path / "c.json").write_text(json.dumps([f"one two {'three ' * (i % 7)}" for i in range(64)]))
    out = subprocess.run([sys.executable, "-m", "benchmarks.systems.embedding_ceiling", "--onnx", str(embeddings.onnx_file()),
                          "--tokenizer", str(embeddings.model_dir()), "--corpus", str(tmp_path / "c.json"), "--seconds", "0.2",
                          "--order", "by-length", "--batch-sizes", "8", "--layout", "1x2"],
                         capture_output=True, text=True, cwd=REPO, env=child_env(), timeout=600, check=True)
    (level,) = json.loads(out.stdout.strip().splitlines()[-1])["levels"]
    assert (level["order"], level["batch_size"], level["concurrency"], level["intra_op_threads"]) == ("by length", 8, 2, 1)
    assert level["rps"] > 0

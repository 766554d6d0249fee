"""benchmarks.llm_relay without its stack: a pass's figures read from vLLM's benchmark client's result
file (its own key names), the CPU split per output token, the passes pooled and the table, so the report
cannot rot. The stack and the client run in the benchmark only; numbers are not checked here."""
from __future__ import annotations

from benchmarks import llm_relay


def vllm_result(tok_s: float, ttft: float) -> dict:
    """The keys ``vllm bench serve --save-result --percentile-metrics ttft,itl --metric-percentiles 50,99``
    writes, with made-up values."""
    return {"completed": 64, "total_output_tokens": 2048, "output_throughput": tok_s, "p50_ttft_ms": ttft,
            "p99_ttft_ms": 3 * ttft, "p50_itl_ms": 2.5, "median_ttft_ms": ttft}


def test_a_pass_is_read_from_vllms_result_and_cpu_is_per_output_token():
    row = llm_relay.summarize("platform", "unpinned", vllm_result(1300.0, 150.0),
                              {"engine": 2.048, "worker": 1.024, "platform": 0.0, "client": 0.512})
    assert row["tok_s"] == 1300.0 and row["ttft_p50_ms"] == 150.0 and row["ttft_p99_ms"] == 450.0
    assert row["cpu_ms_per_token_engine"] == 1.0 and row["cpu_ms_per_token_worker"] == 0.5
    assert row["cpu_ms_per_token_client"] == 0.25


def test_passes_are_averaged_and_the_table_prints_ratios_to_direct(capsys):
    rows = [llm_relay.summarize(system, "pinned", vllm_result(tok_s, 100.0), {"engine": 1.0, "worker": w,
                                                                              "platform": 0.1, "client": 0.2})
            for system, tok_s, w in (("direct", 2000.0, 0.0), ("platform", 1000.0, 1.0),
                                     ("platform", 1400.0, 1.0), ("direct", 1800.0, 0.0))]
    table = [llm_relay.pooled([r for r in rows if r["system"] == s]) for s in ("direct", "platform")]
    assert [t["tok_s"] for t in table] == [1900.0, 1200.0] and [t["passes"] for t in table] == [2, 2]
    llm_relay.print_table({"prompts": 64, "input_tokens": 64, "output_tokens": 32, "concurrency": 8, "passes": 2,
                           "table": table})
    out = capsys.readouterr().out
    assert "0.63x" in out and "1.00x" in out  # 1200 / 1900, and direct against itself

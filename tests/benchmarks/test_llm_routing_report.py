"""benchmarks.llm_routing without engines: a policy's passes pooled (its TTFT percentiles over every
request of every pass, tokens/s over the passes' summed time, the cache counters summed), and the table
and plot from a run's figures, so the report cannot rot. The run itself needs two vLLM replicas: it is a
benchmark, measured by hand (docs/benchmarks.md)."""
from __future__ import annotations

from benchmarks import llm_routing
from benchmarks.llm_routing import Run


def one_pass(ttfts: list[float], tokens: int, wall: float, hits: float, queries: float) -> Run:
    run = Run("prefix", requests=len(ttfts), output_tokens=tokens, wall_s=wall, ttft_s=list(ttfts),
              prompt_tokens=[100] * len(ttfts), hits=hits, queries=queries)
    return run


def test_passes_pool_into_one_policys_figures():
    pooled = Run("prefix")
    pooled.add(one_pass([0.1] * 9 + [1.0], 160, 10.0, 80, 100))
    pooled.add(one_pass([0.2] * 9 + [3.0], 160, 6.0, 40, 100))
    s = pooled.summary()
    assert s["requests"] == 20 and s["output_tokens_per_s"] == 20.0  # 320 tokens over 16 s
    assert s["prefix_cache_hit_rate"] == 0.6  # (80 + 40) / 200
    assert s["ttft_p50_ms"] == 200.0  # the median of all 20 (nine at 0.1 s, nine at 0.2 s, then the two slow)
    assert [p["ttft_p90_ms"] for p in s["passes"]] == [190.0, 480.0]
    assert [p["requests"] for p in s["passes"]] == [10, 10]


def test_table_and_plot_of_a_pooled_run(tmp_path, capsys):
    runs = []
    for policy in llm_routing.POLICIES:
        pooled = Run(policy)
        pooled.add(one_pass([0.1, 0.5, 0.9], 48, 3.0, 50, 100))
        pooled.add(one_pass([0.2, 0.6, 1.0], 48, 3.0, 50, 100))
        runs.append(pooled.summary())
    result = {"conversations": 12, "turns": 12, "streams": 4, "context_words": 1500, "repeats": 2, "runs": runs}
    llm_routing.print_table(result)
    out = capsys.readouterr().out
    assert "2 passes pooled" in out and "TTFT p90 ms per pass" in out
    assert "820 / 920" in out  # each pass's own p90, beside the pooled one
    llm_routing.plot(result, tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"

"""How long and how hard each run is: quick (about 6 min with W0; with ``--requests`` CI's smoke test), full (the record)."""
from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Mode:
    """Load shape of one run; every system gets exactly the same one."""

    name: str
    concurrency: tuple[int, ...]
    warmup_s: float            # discarded, per level: JIT, connection pools, batcher queues
    duration_s: float          # measured, per level (ignored when ``requests`` is set)
    requests: int | None       # fixed request count per level instead of a duration
    warmup_requests: int       # used with ``requests``
    ceiling_batch_sizes: tuple[int, ...]
    ceiling_seconds: float     # per batch size
    corpus_size: int
    workloads: tuple[str, ...]
    skip: tuple[str, ...] = ()  # variants left out unless asked for by name (keeps quick short)
    ceiling_repeats: int = 2   # the ceiling is measured this many times, interleaved with the systems it bounds


# quick: one level, about 6 minutes on a 2-core box with W0; full: the recorded run.
# ``--requests N`` swaps the durations for N requests per level (the smoke test).
MODES: dict[str, Mode] = {
    "quick": Mode("quick", concurrency=(16,), warmup_s=1.5, duration_s=4.0, requests=None, warmup_requests=0,
                  ceiling_batch_sizes=(1, 8, 32), ceiling_seconds=1.5, corpus_size=256, workloads=("W0", "W1", "W2"),
                  # quick leaves out the 2-worker, statistics-off and client-keys stacks (a stack start-up
                  # each) and fusion
                  skip=("platform-triton-nobatch-2w", "platform-triton-batch-2w", "platform-ort-2w",
                        "platform-triton-batch-1w-nostats", "platform-ort-1w-nostats", "platform-ort-fusion-1w",
                        "platform-echo-1w-keys")),
    "full": Mode("full", concurrency=(1, 8, 32), warmup_s=3.0, duration_s=8.0, requests=None,
                 warmup_requests=0, ceiling_batch_sizes=(1, 4, 8, 16, 32, 64), ceiling_seconds=4.0,
                 corpus_size=1024, workloads=("W0", "W1", "W2"), ceiling_repeats=3),
}


def resolve(name: str, requests: int | None = None, concurrency: tuple[int, ...] | None = None) -> Mode:
    """A named mode with command-line overrides applied."""
    mode = MODES[name]
    if requests is not None:
        mode = replace(mode, requests=requests, warmup_requests=min(mode.warmup_requests or 2, requests))
    if concurrency:
        mode = replace(mode, concurrency=concurrency)
    return mode

"""A worker-like process that records statistics events through the real recorder.

Why not the real worker everywhere: exact expectations (bucket counts, label
counts, the last value, drift) need events known in advance, and thousands of them
cost seconds here instead of minutes of model inference on two shared cores.
``test_worker_e2e.py`` covers the real worker. Each process builds
``recorder_from_settings(WorkerSettings())`` exactly as the worker does, calls
``record(event)`` once per simulated request, then closes the recorder (flushing
it) and prints its counters as JSON.

Run: ``python -m tests.serving.statistics.worker_sim ENDPOINT VERSION COUNT DIST SEED``.
Events are deterministic in their arguments, so a test can compute expectations
with :func:`make_events`.
"""
from __future__ import annotations

import json
import random
import sys
from typing import Any

POSITIVE = "good great fine lovely happy nice superb pleasant calm bright".split()
NEGATIVE = "bad awful poor sad angry broken slow noisy ugly dull rude late".split()

# Distribution name -> (min words, max words, vocabulary, labels and their weights)
DISTRIBUTIONS: dict[str, tuple[int, int, list[str], dict[str, float]]] = {
    "reference": (4, 14, POSITIVE, {"POSITIVE": 0.8, "NEGATIVE": 0.2}),
    "shifted": (30, 90, NEGATIVE, {"POSITIVE": 0.2, "NEGATIVE": 0.6, "UNSURE": 0.2}),
}
SCALAR_BUCKETS = [8, 16, 32, 64, 128]


def text_for(rng: random.Random, dist: str) -> tuple[str, str]:
    low, high, vocab, labels = DISTRIBUTIONS[dist]
    words = [rng.choice(vocab) for _ in range(rng.randint(low, high))]
    label = rng.choices(list(labels), weights=list(labels.values()))[0]
    return " ".join(words), label


def make_events(endpoint: str, version: int, count: int, dist: str, seed: int) -> list[dict[str, Any]]:
    """``count`` requests: every 10th fails with 500; custom variables from the text.
    ``dist`` "shadow": copies served by shadow ``version`` (of live version 1): reference texts,
    3 in 4 agreeing with the live answer, every 20th dropped. ``dist`` "keys": see :func:`keyed_events`."""
    if dist == "shadow":
        events = make_events(endpoint, version, count, "reference", seed)
        rng = random.Random(seed)
        for i, event in enumerate(events):
            event["shadow"] = ({"live_version": 1, "dropped": True} if i % 20 == 19 else
                               {"live_version": 1, "agree": i % 4 != 0, "mad": round(rng.uniform(0, 0.5), 4)})
        return events
    if dist == "keys":
        return keyed_events(endpoint, version, count, seed)
    rng = random.Random(seed)
    events = []
    for i in range(count):
        text, label = text_for(rng, dist)
        pre, inf, post = rng.uniform(0.0005, 0.002), rng.uniform(0.002, 0.2), rng.uniform(0.0001, 0.001)
        events.append({
            "endpoint": endpoint, "version": version, "status": 500 if i % 10 == 9 else 200,
            "latency_s": pre + inf + post,
            "stages": {"preprocess": pre, "inference": inf, "postprocess": post},
            "custom": {"tokens": len(text.split()), "label": label, "score": round(rng.random(), 3)},
        })
    return events


KEYS = ("web", "batch")


def keyed_events(endpoint: str, version: int, count: int, seed: int) -> list[dict[str, Any]]:
    """Requests of workers with client keys required: by key name, alternating, every 4th one of key
    "batch" refused over its rate (429) and every 5th a request without a key (401)."""
    events = make_events(endpoint, version, count, "reference", seed)
    for i, event in enumerate(events):
        if i % 5 == 4:
            events[i] = {"endpoint": endpoint, "version": None, "status": 401, "latency_s": 0.0,
                         "refused": "missing_key"}
        elif i % 4 == 3:
            events[i] = {"endpoint": endpoint, "version": None, "status": 429, "latency_s": 0.0,
                         "refused": "rate", "key": "batch"}
        else:
            event["key"] = KEYS[i % 2]
    return events


def main(argv: list[str]) -> int:
    from serving.settings import WorkerSettings
    from serving.statistics import recorder_from_settings

    endpoint, version, count, dist, seed = argv[0], int(argv[1]), int(argv[2]), argv[3], int(argv[4])
    recorder = recorder_from_settings(WorkerSettings(), follow_config=False)
    for event in make_events(endpoint, version, count, dist, seed):
        recorder.record(event)
    flushed = recorder.flush(timeout=30.0)
    recorder.close(timeout=30.0)
    stats = recorder.stats()
    print(json.dumps({"flushed": flushed, "sent": stats.sent, "dropped": stats.dropped, "source": recorder.source}))
    return 0 if flushed and stats.dropped == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

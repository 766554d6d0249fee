"""One record from a finished request (serving/prediction_log/record.py): JSON of what the client sent
and got, tensors with dtype and shape, summaries past the cap, redaction everywhere, even in previews."""
from __future__ import annotations

import numpy as np
import orjson

from serving.prediction_log.policy import LogPolicy
from serving.prediction_log.record import Captured, build


def record(policy: LogPolicy, inputs, outputs=None, **kw) -> dict:
    return build(Captured(policy, inputs, outputs), request_id="r1", endpoint="clf", version=2, status=200,
                 latency_s=0.0123456789, **kw)


def test_json_and_tensors_as_sent_and_answered():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    r = record(LogPolicy(sample=100), {"x": x, "names": np.array([b"a", b"b"], dtype=object)},
               {"label": "cat", "score": np.float32(0.5)}, client="team-a")
    assert r["inputs"] == {"x": {"dtype": "float32", "shape": [2, 3], "data": [[0, 1, 2], [3, 4, 5]]},
                           "names": {"dtype": "object", "shape": [2], "data": ["a", "b"]}}
    assert r["outputs"] == {"label": "cat", "score": 0.5}
    assert (r["request_id"], r["endpoint"], r["version"], r["status"], r["shadow"], r["client"]) == \
        ("r1", "clf", 2, 200, False, "team-a")
    orjson.dumps(r)  # all of it is JSON


def test_past_the_cap_a_summary_that_says_what_it_stands_for():
    policy = LogPolicy(sample=100, max_bytes=1000)
    big = np.linspace(0, 1, 10_000, dtype=np.float64)
    r = record(policy, {"x": big}, {"text": "y" * 5000})
    s = r["inputs"]["x"]
    assert s["summarized"] and s["shape"] == [10_000] and s["bytes"] == 80_000 and len(s["sha256"]) == 64
    assert (s["min"], s["max"]) == (0.0, 1.0) and abs(s["mean"] - 0.5) < 1e-9
    out = r["outputs"]
    assert out["summarized"] and out["bytes"] > 5000 and out["preview"].startswith('{"text":"yyy')


def test_redaction_runs_before_the_cap_and_on_every_string():
    policy = LogPolicy(sample=100, max_bytes=300, redact=(__import__("re").compile(r"secret-\w+"),))
    r = record(policy, {"a": ["secret-one", b"secret-two"], "b": "x" * 400 + " secret-three"},
               error="failed on secret-four")
    text = orjson.dumps(r).decode()
    assert "secret-" not in text and "[REDACTED]" in text
    assert r["error"] == "failed on [REDACTED]"


def test_only_the_fields_asked_for():
    r = record(LogPolicy(sample=100, fields=frozenset({"outputs"})), {"text": "hi"}, {"label": 1},
               error="x", client="k")
    assert set(r) == {"request_id", "ts", "endpoint", "version", "status", "latency_s", "shadow", "outputs"}

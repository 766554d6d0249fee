"""Rotating JSON Lines files (serving/prediction_log/sinks/files.py): one line a record, a new file past
the size, the oldest deleted past the count, files of one process never renamed."""
from __future__ import annotations

import orjson

from serving.prediction_log.sinks.files import RotatingFiles


def test_rotation_and_retention(tmp_path):
    sink = RotatingFiles(tmp_path, "host:123", max_bytes=1000, keep=3)
    for batch in range(10):
        sink.write([{"endpoint": "e", "i": batch * 10 + i, "pad": "x" * 40} for i in range(10)])
    sink.close()
    files = sink.files()
    assert len(files) == 3 and all(f.name.startswith("predictions-host_123-") for f in files)
    rows = [orjson.loads(line) for f in files for line in f.read_bytes().splitlines()]
    assert [r["i"] for r in rows] == list(range(70, 100)), "the newest files kept, in order, whole lines"
    assert all(f.stat().st_size <= 1000 for f in files)

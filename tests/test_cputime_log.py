"""tests/support/cputime.py counts the CPU of the processes a test starts, reaped or still running, and
its report sums the files of every pytest process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from tests.support.cputime import report, tree_cpu

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.5: pass\n"


def others() -> float:
    """What tree_cpu() counts beyond this process's own CPU (which polling it spends)."""
    own = os.times()
    return tree_cpu() - own.user - own.system


def test_a_reaped_child_and_a_running_one_are_counted():
    before = others()
    subprocess.run([sys.executable, "-c", BURN], check=True, timeout=60)
    after_reaped = others()
    assert after_reaped - before >= 0.5
    running = subprocess.Popen([sys.executable, "-c", BURN + "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        while others() < after_reaped + 0.5:  # the child's CPU shows while it runs (bounded by the test timeout)
            assert running.poll() is None, "the child ended before its CPU was counted"
            time.sleep(0.05)
    finally:
        running.communicate(b"", timeout=60)


def test_the_report_sums_every_process_and_sorts_by_cpu(tmp_path):
    log = tmp_path / "cpu"
    (tmp_path / "cpu.gw0.json").write_text(json.dumps({"tests/a.py": {"cpu": 10.0, "wall": 20.0}}))
    (tmp_path / "cpu.gw1.json").write_text(json.dumps({"tests/b.py": {"cpu": 30.0, "wall": 5.0}}))
    lines = report(log).splitlines()
    assert lines[1].startswith("tests/b.py") and lines[2].startswith("tests/a.py")
    assert lines[-1].split() == ["total", "40"]

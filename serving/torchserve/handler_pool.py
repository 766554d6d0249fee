"""An archive's handler processes in one worker process, and TorchServe's batching in front of them.

Requests wait in one queue per model version. Each handler process has a thread that takes the
oldest request, then more until the batch holds ``batchSize`` or ``maxBatchDelay`` has passed
since it started filling (TorchServe's rule), sends the batch and hands each request its answer.
A batch past ``responseTimeout`` has its process ended and started again, as TorchServe restarts
a backend worker, and each of its requests is answered with a timeout. A process that dies is
started again for the next batch. Threads, not the event loop: a batch and a process start block.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from serving.torchserve.archive import ArchiveInfo
from serving.torchserve.codec import HandlerAnswer, HandlerRequest
from serving.torchserve.handler_process import receive, send

log = logging.getLogger(__name__)
LOAD_TIMEOUT_S = 300.0  # a handler's initialize (imports, weights); TorchServe's default startup timeout is 120


@dataclass
class PoolSpec:
    """How one version's handler runs here: the archive's values, with registration's overrides."""

    model_name: str
    model_dir: Path
    info: ArchiveInfo
    batch_size: int = 1
    max_batch_delay_ms: int = 100
    response_timeout_s: float = 120.0
    workers: int = 1  # handler processes in this worker process
    threads: int = 0  # torch threads in each (0: OMP_NUM_THREADS, else default_threads(workers))
    runtime: str = "torch"  # torch | onnx | auto: onnxruntime in place of the handler's model (onnx_swap.py)
    log_path: Path | None = None
    packages: Path | None = None  # the archive's requirements, installed (per-model installs)


@dataclass
class _Pending:
    request: HandlerRequest
    done: Callable[[HandlerAnswer, dict[str, Any]], None]
    queued_at: float = field(default_factory=time.perf_counter)


class HandlerFailedToLoad(RuntimeError):
    pass


class _Process:
    """One handler process and its socket."""

    def __init__(self, spec: PoolSpec, index: int) -> None:
        self.spec, self.index = spec, index
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.runtime: dict[str, Any] = {}  # its latest runtime report (runtime onnx or auto)

    def start(self) -> None:
        parent, child = socket.socketpair()
        gpu = _gpu_for(self.index)
        spec = {"model_dir": str(self.spec.model_dir), "model_name": self.spec.model_name,
                "handler": self.spec.info.handler, "batch_size": self.spec.batch_size, "gpu_id": gpu,
                "threads": self.spec.threads, "runtime": self.spec.runtime}
        self.runtime = {}
        out = open(self.spec.log_path, "ab") if self.spec.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "serving.torchserve.handler_process", "--fd", str(child.fileno()),
                 "--spec", json.dumps(spec)],
                pass_fds=(child.fileno(),), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                cwd=str(self.spec.model_dir), env=_child_env(self.spec.packages, self.spec.workers))
        finally:
            child.close()
            if out is not subprocess.DEVNULL:
                out.close()
        self.sock = parent
        parent.settimeout(LOAD_TIMEOUT_S)
        try:
            loaded = receive(parent)
        except (EOFError, OSError) as exc:
            self.stop()
            raise HandlerFailedToLoad(f"the handler process ended while loading ({exc}){self._log_tail()}") from None
        if not loaded.get("loaded"):
            self.stop()
            raise HandlerFailedToLoad(f"{loaded.get('error')}{self._log_tail()}")

    def run(self, batch: list[HandlerRequest], timeout_s: float) -> dict[str, Any]:
        assert self.sock is not None
        self.sock.settimeout(timeout_s)
        send(self.sock, batch)
        return receive(self.sock)

    def alive(self) -> bool:
        return self.sock is not None and self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def _log_tail(self) -> str:
        path = self.spec.log_path
        if not path or not path.exists():
            return ""
        lines = path.read_text(errors="replace").strip().splitlines()[-5:]
        return ("; its log ends: " + " | ".join(lines)) if lines else ""


def _gpu_for(index: int) -> int | None:
    """GPU ids round robin over the handler processes, as TorchServe assigns them (None on CPU)."""
    try:
        import torch

        count = torch.cuda.device_count()
    except Exception:
        return None
    return index % count if count else None


def _child_env(packages: Path | None, workers: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(packages or ""), root, env.get("PYTHONPATH", "")) if p)
    env.pop("PYTHONSAFEPATH", None)  # the handler's own modules are imported from its folder
    env.setdefault("OMP_NUM_THREADS", str(default_threads(workers)))  # the operator's own setting wins
    return env


def default_threads(workers: int) -> int:
    """torch's intra-op threads in each of ``workers`` handler processes, unless the endpoint's ``threads``
    option (torch.set_num_threads in the process) or the operator's OMP_NUM_THREADS says otherwise: this
    process's cores shared between them, TorchServe's own tuning advice (cores / workers) applied. torch's
    default is every core in every process, and the threads of several processes then wait for each other
    at the end of each operator, spinning (libgomp) on the cores the others need: on 2 cores, 2 handler
    processes of a small CNN answered 90 requests/s at 8 clients with torch's default, 1,600 with one
    thread each (measured on a 2-core machine). onnxruntime's threads (runtime onnx) are set apart."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, workers))


class HandlerPool:
    """The handler processes of one model version, fed by TorchServe's batching."""

    def __init__(self, spec: PoolSpec) -> None:
        self.spec = spec
        self._queue: "queue.Queue[_Pending | None]" = queue.Queue()
        self._processes = [_Process(spec, i) for i in range(max(1, spec.workers))]
        self._threads: list[threading.Thread] = []
        self._closed = False

    def start(self) -> None:
        """Start every handler process and wait until each has loaded (HandlerFailedToLoad if one cannot)."""
        try:
            for process in self._processes:
                process.start()
        except Exception:
            self.close()
            raise
        for process in self._processes:
            thread = threading.Thread(target=self._serve, args=(process,), daemon=True,
                                      name=f"torchserve-{self.spec.model_name}-{process.index}")
            thread.start()
            self._threads.append(thread)

    async def submit(self, request: HandlerRequest) -> tuple[HandlerAnswer, dict[str, Any]]:
        """Queue one request; its answer and its timings (queue and handler seconds, the batch size)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future = loop.create_future()

        def done(answer: HandlerAnswer, timings: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(_settle, future, (answer, timings))

        if self._closed:
            raise RuntimeError("the handler pool is closed")
        self._queue.put(_Pending(request, done))
        return await future

    def close(self) -> None:
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for process in self._processes:
            process.stop()
        while True:  # what still waits is answered, never left hanging
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                break
            if pending is not None:
                pending.done(HandlerAnswer(status=503, message="the model version was removed",
                                           error_type="ServiceUnavailableException"), {})

    # --- one thread per handler process ------------------------------------------------
    def _serve(self, process: _Process) -> None:
        while not self._closed:
            batch = self._next_batch()
            if batch is None:
                return
            self._run(process, batch)

    def _next_batch(self) -> list[_Pending] | None:
        first = self._queue.get()
        if first is None:
            return None
        batch = [first]
        deadline = time.monotonic() + self.spec.max_batch_delay_ms / 1000.0
        while len(batch) < self.spec.batch_size:
            left = deadline - time.monotonic()
            try:
                item = self._queue.get(timeout=left) if left > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._queue.put(None)  # another thread's stop signal, or this one's: keep it for the loop
                break
            batch.append(item)
        return batch

    def _run(self, process: _Process, batch: list[_Pending]) -> None:
        sent = time.perf_counter()
        timings = {"batch": len(batch), "hostname": socket.gethostname()}
        try:
            if not process.alive():  # ended since its last batch (or its restart failed): start it first
                process.stop()
                process.start()
            reply = process.run([p.request for p in batch], self.spec.response_timeout_s)
        except socket.timeout:
            log.warning("%s: a batch of %d passed responseTimeout %ss; restarting its handler process",
                        self.spec.model_name, len(batch), self.spec.response_timeout_s)
            process.stop()  # its answers are not waited for: the clients hear at once, then it starts again
            self._fail(batch, HandlerAnswer(
                status=504, error_type="RequestTimeoutException",
                message=f"the handler did not answer within responseTimeout ({self.spec.response_timeout_s:g} s)"),
                timings)
            self._restart(process)
            return
        except Exception as exc:  # the process died, or could not be started again
            log.warning("%s: handler process failed: %s", self.spec.model_name, exc)
            process.stop()
            self._fail(batch, HandlerAnswer(status=503, error_type="ServiceUnavailableException",
                                            message=f"the handler process failed: {exc}"), timings)
            self._restart(process)
            return
        handler_s = float(reply.get("handler_s") or 0.0)
        timings.update(self._runtime(process, reply.get("runtime")))
        metrics = list(reply.get("metrics") or ())  # the batch's custom metric lines, reported by its first request
        for i, (pending, answer) in enumerate(zip(batch, reply["answers"])):
            pending.done(answer, {**timings, "queue_s": sent - pending.queued_at, "handler_s": handler_s,
                                  **({"metrics": metrics} if i == 0 and metrics else {})})

    def _runtime(self, process: _Process, report: dict[str, Any] | None) -> dict[str, Any]:
        """What ran the batch's model calls (onnx, torch), for its timings; the reason once, logged by the
        worker too, when the process's decision is made or changes (serving/torchserve/onnx_swap.py)."""
        if not report:
            return {}
        used = ",".join(report.get("used") or ()) or report.get("runtime", "")
        decided = (report.get("runtime"), report.get("reason")) != (process.runtime.get("runtime"),
                                                                    process.runtime.get("reason"))
        process.runtime = report
        if not decided or report.get("pending"):
            return {"runtime": used}
        note = f"{report.get('runtime')}: {report.get('reason')}"
        level = (logging.INFO if report.get("runtime") == "onnx"
                 else logging.ERROR if report.get("requested") == "onnx" else logging.WARNING)
        log.log(level, "%s: handler process %d (runtime %s) runs its model with %s", self.spec.model_name,
                process.index, report.get("requested"), note)
        return {"runtime": used, "runtime_note": note}

    def runtimes(self) -> list[dict[str, Any]]:
        """Each handler process's latest runtime report ({} before its first batch, or for runtime torch)."""
        return [dict(process.runtime) for process in self._processes]

    def _restart(self, process: _Process) -> None:
        process.stop()
        if self._closed:
            return
        try:
            process.start()
        except Exception as exc:
            log.warning("%s: restarting the handler process failed (%s); the next batch tries again",
                        self.spec.model_name, exc)

    @staticmethod
    def _fail(batch: list[_Pending], answer: HandlerAnswer, timings: dict[str, Any]) -> None:
        for pending in batch:
            pending.done(answer, timings)


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)

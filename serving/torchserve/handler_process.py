"""One handler process: loads an archive's handler as TorchServe's backend does and runs its batches.

Why a process of its own, as TorchServe's backend workers are: each archive imports its own
modules by their plain names (two versions of one model both ship ``model.py``), a handler may
hold the GIL in its preprocessing, and a handler past its ``responseTimeout`` can only be stopped
by ending its process. The worker (serving/torchserve/handler_pool.py) starts it with a socket
and talks in length-prefixed pickles: one load answer, then one batch in, one list of answers out.

The handler is found and initialized by TorchServe's own loader (``ts.model_loader``, from the
``torchserve`` package), so built-in names, ``module:function`` entry points and ``BaseHandler``
subclasses resolve exactly as there; its context is TorchServe's ``Context``. A batch that raises
is run again one request at a time, so only the request that fails gets the error.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import socket
import struct
import sys
import time
from typing import Any

from serving.torchserve.codec import HandlerAnswer, HandlerRequest, encode_answer, handler_input, parameter_headers

log = logging.getLogger("serving.torchserve.handler")
_LEN = struct.Struct("!Q")


def send(sock: socket.socket, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LEN.pack(len(data)) + data)


def receive(sock: socket.socket) -> Any:
    (size,) = _LEN.unpack(_exactly(sock, _LEN.size))
    return pickle.loads(_exactly(sock, size))


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other side closed the socket")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class MetricLines(logging.Handler):
    """Custom metrics a handler adds through ``context.metrics``: TorchServe's metric objects log one
    ``[METRICS]name.unit:value|#dims|#type:KIND|...`` line each; collected here, sent with the answers."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("[METRICS]"):
            self.lines.append(text)

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


class Handler:
    """The loaded handler and its TorchServe context."""

    def __init__(self, spec: dict[str, Any]) -> None:
        from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
        from ts.model_loader import TsModelLoader
        import ts

        model_dir = spec["model_dir"]
        os.chdir(model_dir)  # TorchServe starts its backend in the model's folder, on its path
        sys.path.insert(0, model_dir)
        self.metric_lines = MetricLines()
        logging.getLogger("ts.metrics.caching_metric").addHandler(self.metric_lines)
        metrics = MetricsCacheYamlImpl(config_file_path=os.path.join(os.path.dirname(ts.__file__), "configs",
                                                                     "metrics.yaml"))
        metrics.initialize_cache()
        metrics.model_name = spec["model_name"]
        self.service = TsModelLoader().load(spec["model_name"], model_dir, spec["handler"], spec.get("gpu_id"),
                                            spec["batch_size"], None, True, metrics)
        self.context = self.service.context
        self.metric_lines.take()  # what initialization logged is not a request's
        self.swap = None  # engine option runtime: onnxruntime in place of the handler's model
        if (spec.get("runtime") or "torch") != "torch":  # (torch, the default, changes nothing and imports nothing)
            from serving.torchserve.onnx_swap import install

            self.swap = install(self.service, spec["runtime"], int(spec.get("threads") or 0))

    def predict(self, batch: list[HandlerRequest]) -> list[HandlerAnswer]:
        answers = self._call(batch)
        if answers is not None:
            return answers
        if len(batch) == 1:
            return [self._failure]
        return [self._alone(request) for request in batch]  # only the request that fails gets the error

    def _alone(self, request: HandlerRequest) -> HandlerAnswer:
        answers = self._call([request])
        return answers[0] if answers is not None else self._failure

    def _call(self, batch: list[HandlerRequest]) -> list[HandlerAnswer] | None:
        """The handler on one batch; None when it raised (``self._failure`` then says why)."""
        from ts.context import RequestProcessor
        from ts.utils.util import PredictionException

        ids = {i: r.request_id for i, r in enumerate(batch)}
        self.context.request_ids = ids
        self.context.request_processor = [RequestProcessor(parameter_headers(r)) for r in batch]
        self.context.metrics.request_ids = ids
        self.context.cl_socket = None
        started = time.time()
        try:
            returned = self.service._entry_point([handler_input(r) for r in batch], self.context)
        except PredictionException as exc:
            self._failure = HandlerAnswer(status=exc.error_code, message=exc.message, error_type="PredictionException")
            return None
        except MemoryError:
            self._failure = HandlerAnswer(status=507, message="Out of resources", error_type="InternalServerException")
            return None
        except Exception as exc:  # the handler could not use this request
            log.warning("the handler raised on a batch of %d", len(batch), exc_info=True)
            self._failure = HandlerAnswer(status=400, error_type="BadRequestException",
                                          message=f"the handler could not process the request: "
                                                  f"{type(exc).__name__}: {_brief(exc)}")
            return None
        answers = self._answers(batch, returned)
        if all(a.status == 200 for a in answers):  # TorchServe's backend times each good batch (ts/service.py)
            self.context.metrics.add_time("PredictionTime", round((time.time() - started) * 1000, 2))
        return answers

    def _answers(self, batch: list[HandlerRequest], returned: Any) -> list[HandlerAnswer]:
        if not isinstance(returned, list) or len(returned) != len(batch):
            why = ("Invalid model predict output" if not isinstance(returned, list)
                   else f"number of batch response mismatched: expected {len(batch)}, got {len(returned)}")
            return [HandlerAnswer(status=503, message=why, error_type="InternalServerException") for _ in batch]
        answers = []
        for i, value in enumerate(returned):
            try:
                body, kind = encode_answer(value)
            except TypeError as exc:
                answers.append(HandlerAnswer(status=503, message=f"Unsupported model output data type: {exc}",
                                             error_type="InternalServerException"))
                continue
            code, phrase = self.context.get_response_status(i)
            headers = dict(self.context.get_response_headers(i))
            content_type = headers.pop("content-type", "") or kind
            answers.append(HandlerAnswer(status=code or 200, body=body, content_type=content_type, headers=headers,
                                         message=phrase or ""))
        return answers


def _brief(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:300]


def serve(sock: socket.socket, spec: dict[str, Any]) -> None:
    threads = int(spec.get("threads") or 0)
    if threads > 0:
        import torch

        torch.set_num_threads(threads)
    _vision()
    try:
        handler = Handler(spec)
    except Exception as exc:
        log.exception("loading the handler failed")
        send(sock, {"loaded": False, "error": f"{type(exc).__name__}: {_brief(exc)}"})
        return
    send(sock, {"loaded": True, "pid": os.getpid()})
    while True:
        try:
            batch = receive(sock)
        except EOFError:
            return
        started = time.perf_counter()
        answers = handler.predict(batch)
        reply = {"answers": answers, "metrics": handler.metric_lines.take(), "handler_s": time.perf_counter() - started}
        if handler.swap is not None:  # what ran the model, and why (runtime onnx or auto)
            reply["runtime"] = handler.swap.take()
        send(sock, reply)


def _vision() -> None:
    """Image handlers import torchvision: make that work where its C++ ops cannot load
    (serving/torchserve/vision_ops.py); any other failure surfaces when the handler imports it."""
    try:
        from serving.torchserve.vision_ops import ensure_torchvision
    except ImportError:
        return
    try:
        ensure_torchvision()
    except Exception:
        log.warning("torchvision is not importable here", exc_info=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--spec", required=True, help="JSON: model_dir, model_name, handler, batch_size, gpu_id")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s handler[%(process)d] %(levelname)s %(name)s: %(message)s")
    sock = socket.socket(fileno=args.fd)
    try:
        serve(sock, json.loads(args.spec))
    finally:
        sock.close()


if __name__ == "__main__":
    main()

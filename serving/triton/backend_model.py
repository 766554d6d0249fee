"""The ``model.py`` of every embedded-Triton model: onnxruntime inside Triton's Python backend.

Copied as ``<repository>/<model>/1/model.py`` by serving/triton/python_backend.py and run by
Triton's ``triton_python_backend_stub`` (one stub process per model instance), with the ONNX
file beside it. Nothing stands between Triton and onnxruntime: ``execute`` gets the whole
batch Triton's dynamic batcher formed, concatenates the requests' inputs, calls
``session.run`` once and splits the outputs back per request.

Kept importable outside Triton (tests drive ``TritonPythonModel`` with a stand-in for
``triton_python_backend_utils``): ``pb_utils`` is looked up when first needed.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

PB_UTILS: Any = None


def _pb() -> Any:
    global PB_UTILS
    if PB_UTILS is None:
        import triton_python_backend_utils

        PB_UTILS = triton_python_backend_utils
    return PB_UTILS


def open_session(path: Path, threads: int) -> Any:
    """serving/ort.py's session (CUDA when this onnxruntime has it, no spinning threads); the same
    options by hand where the serving package cannot be imported."""
    try:
        from serving.ort import session
    except ImportError:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        available = ort.get_available_providers()
        wanted = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
        return ort.InferenceSession(str(path), sess_options=options, providers=wanted)
    return session(path, threads)


def _param(config: dict[str, Any], key: str, default: str) -> str:
    return ((config.get("parameters") or {}).get(key) or {}).get("string_value") or default


def run_batch(session: Any, input_names: list[str], output_names: list[str],
              feeds_per_request: list[dict[str, np.ndarray]], batched: bool) -> list[Any]:
    """One entry per request: a dict of outputs, or the exception its group raised.

    With batching, requests whose inputs have the same shape past the batch dimension are
    concatenated and run together (Triton's batcher only groups same-shape requests, so that is
    normally the whole batch); without it (``max_batch_size: 0``) each request is run alone,
    its shapes are whole shapes."""
    results: list[Any] = [None] * len(feeds_per_request)
    groups: dict[tuple, list[int]] = {}
    for i, feeds in enumerate(feeds_per_request):
        key = tuple((n, feeds[n].shape[1:], str(feeds[n].dtype)) for n in input_names) if batched else (i,)
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        try:
            if len(members) == 1:
                outs = session.run(output_names, feeds_per_request[members[0]])
                results[members[0]] = dict(zip(output_names, outs))
                continue
            sizes = [feeds_per_request[i][input_names[0]].shape[0] for i in members]
            feeds = {n: np.concatenate([feeds_per_request[i][n] for i in members]) for n in input_names}
            outs = session.run(output_names, feeds)
            bounds = np.cumsum(sizes)[:-1]
            parts = [np.split(out, bounds) for out in outs]
            for j, i in enumerate(members):
                results[i] = {name: parts[k][j] for k, name in enumerate(output_names)}
        except Exception as exc:  # the group's requests fail, the others are answered
            for i in members:
                results[i] = exc
    return results


class TritonPythonModel:
    """Triton's Python-backend contract: initialize / execute / finalize."""

    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        here = Path(args["model_repository"]) / str(args["model_version"])
        self.batched = int(config.get("max_batch_size") or 0) > 0
        self.input_names = [t["name"] for t in config.get("input", [])]
        self.output_names = [t["name"] for t in config.get("output", [])]
        threads = int(_param(config, "ort_threads", "1"))
        self.session = open_session(here / _param(config, "onnx_file", "model.onnx"), threads)
        if not self.output_names:
            self.output_names = [o.name for o in self.session.get_outputs()]

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = _pb()
        feeds = []
        for request in requests:
            feeds.append({n: pb.get_input_tensor_by_name(request, n).as_numpy() for n in self.input_names})
        responses = []
        for result in run_batch(self.session, self.input_names, self.output_names, feeds, self.batched):
            if isinstance(result, Exception):
                responses.append(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(str(result))))
            else:
                responses.append(pb.InferenceResponse(output_tensors=[
                    pb.Tensor(name, np.ascontiguousarray(value)) for name, value in result.items()]))
        return responses

    def finalize(self) -> None:
        self.session = None

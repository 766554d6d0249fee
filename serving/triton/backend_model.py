"""The ``model.py`` of every embedded-Triton model: onnxruntime inside Triton's Python backend.

Copied as ``<repository>/<model>/1/model.py`` by serving/triton/python_backend.py and run by
Triton's ``triton_python_backend_stub`` (one stub process per model instance), with the ONNX
file beside it. Nothing stands between Triton and onnxruntime: ``execute`` gets the whole
batch Triton's dynamic batcher formed, concatenates the requests' inputs, runs them and splits
the outputs back per request. Token sequences padded behind an attention mask (the worker's
batcher pads to the longest) are run in length groups with the padding cut off, since on CPU
padding costs more than batching saves (see ``length_groups``).

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


MASK = "attention_mask"
MAX_PADDING = 1.25  # a length group computes at most this many tokens per real token


def length_groups(lengths: np.ndarray, max_padding: float = MAX_PADDING) -> list[np.ndarray]:
    """Row indices grouped by length (sorted), each group padded to its own longest row computing at
    most ``max_padding`` times its real tokens. Measured on W2 (MiniLM-L6, 2 cores): padded batches
    of mixed-length texts ran at 12-28 texts/s against 51 one text at a time, while same-length
    rows batched ran faster than alone, so a batch pays only once its padding is taken out."""
    order = np.argsort(lengths, kind="stable")
    groups: list[list[int]] = []
    total = 0
    for i in order:
        n = int(lengths[i])
        if groups and (len(groups[-1]) + 1) * n <= max_padding * (total + n):
            groups[-1].append(int(i))
            total += n
        else:
            groups.append([int(i)])
            total = n
    return [np.asarray(g) for g in groups]


def unpadded_lengths(feeds: dict[str, np.ndarray]) -> np.ndarray | None:
    """Each row's real length when the inputs are right-padded token sequences behind an attention
    mask (what the worker's batcher and tokenizers send); None when that cannot be assumed."""
    mask = feeds.get(MASK)
    if mask is None or mask.ndim != 2 or any(a.ndim != 2 or a.shape != mask.shape for a in feeds.values()):
        return None
    lengths = (mask != 0).sum(axis=1)
    if not np.array_equal(mask != 0, np.arange(mask.shape[1])[None, :] < lengths[:, None]):
        return None  # not right padding: leave the rows as they are
    return np.maximum(lengths, 1)


def run_rows(session: Any, output_names: list[str], feeds: dict[str, np.ndarray],
             trim: bool) -> list[np.ndarray]:
    """``session.run`` on a batch; with ``trim`` (outputs of fixed size per row) the padding is taken
    out first: rows run in length groups, each cut to its longest row, results put back in order."""
    lengths = unpadded_lengths(feeds) if trim else None
    rows = next(iter(feeds.values())).shape[0]
    if lengths is None or rows == 1 and lengths[0] == next(iter(feeds.values())).shape[1]:
        return session.run(output_names, feeds)
    groups = length_groups(lengths)
    if len(groups) == 1 and lengths.max() == next(iter(feeds.values())).shape[1]:
        return session.run(output_names, feeds)
    outs: list[np.ndarray | None] = [None] * len(output_names)
    for group in groups:
        width = int(lengths[group].max())
        part = session.run(output_names, {n: np.ascontiguousarray(a[group, :width]) for n, a in feeds.items()})
        for k, value in enumerate(part):
            if outs[k] is None:
                outs[k] = np.empty((rows, *value.shape[1:]), dtype=value.dtype)
            outs[k][group] = value
    return outs  # type: ignore[return-value]


def run_batch(session: Any, input_names: list[str], output_names: list[str],
              feeds_per_request: list[dict[str, np.ndarray]], batched: bool, trim: bool = False) -> list[Any]:
    """One entry per request: a dict of outputs, or the exception its group raised.

    With batching, requests whose inputs have the same shape past the batch dimension are
    concatenated and run together (Triton's batcher only groups same-shape requests, so that is
    normally the whole batch), padding taken out with ``trim``; without batching
    (``max_batch_size: 0``) each request is run alone, its shapes are whole shapes."""
    from serving.ort import string_feeds  # no fallback: a string tensor must never reach onnxruntime as bytes

    results: list[Any] = [None] * len(feeds_per_request)
    feeds_per_request = list(feeds_per_request)
    groups: dict[tuple, list[int]] = {}
    for i, feeds in enumerate(feeds_per_request):
        try:
            feeds_per_request[i] = feeds = string_feeds(feeds)
        except ValueError as exc:  # this request fails, the others are answered
            results[i] = exc
            continue
        key = tuple((n, feeds[n].shape[1:], str(feeds[n].dtype)) for n in input_names) if batched else (i,)
        groups.setdefault(key, []).append(i)
    for members in groups.values():
        try:
            if len(members) == 1:
                outs = run_rows(session, output_names, feeds_per_request[members[0]], trim and batched)
                results[members[0]] = dict(zip(output_names, outs))
                continue
            sizes = [feeds_per_request[i][input_names[0]].shape[0] for i in members]
            feeds = {n: np.concatenate([feeds_per_request[i][n] for i in members]) for n in input_names}
            outs = run_rows(session, output_names, feeds, trim)
            bounds = np.cumsum(sizes)[:-1]
            parts = [np.split(out, bounds) for out in outs]
            for j, i in enumerate(members):
                results[i] = {name: parts[k][j] for k, name in enumerate(output_names)}
        except Exception as exc:  # the group's requests fail, the others are answered
            for i in members:
                results[i] = exc
    return results


def _error(pb: Any, exc: Exception) -> Any:
    """The request's error for Triton: a ValueError is the input's fault (a string tensor that is
    not UTF-8), INVALID_ARG, which the worker answers 400; anything else Triton's default."""
    code = getattr(pb.TritonError, "INVALID_ARG", None) if isinstance(exc, ValueError) else None
    return pb.TritonError(str(exc)) if code is None else pb.TritonError(str(exc), code)


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
        # padding may be taken out only where no output's size follows the sequence length
        self.trim = bool(config.get("output")) and all(
            all(int(d) >= 0 for d in t.get("dims", [])) for t in config["output"])

    def execute(self, requests: list[Any]) -> list[Any]:
        pb = _pb()
        feeds = []
        for request in requests:
            feeds.append({n: pb.get_input_tensor_by_name(request, n).as_numpy() for n in self.input_names})
        responses = []
        for result in run_batch(self.session, self.input_names, self.output_names, feeds, self.batched,
                                 self.trim):
            if isinstance(result, Exception):
                responses.append(pb.InferenceResponse(output_tensors=[], error=_error(pb, result)))
            else:
                responses.append(pb.InferenceResponse(output_tensors=[
                    pb.Tensor(name, np.ascontiguousarray(value)) for name, value in result.items()]))
        return responses

    def finalize(self) -> None:
        self.session = None

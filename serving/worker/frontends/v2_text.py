"""Text over v2 on a tokenizer endpoint: one BYTES tensor of texts in, ``/serve``'s answer out as tensors.

A v2 client of a Triton ensemble with a tokenizer step, or of MLServer's Hugging Face runtime,
sends the text itself; the worker's tokenizer is the point of the endpoint, so the client should
not have to tokenize. The texts go through the data plane's ``infer`` (preprocess, model,
postprocess: exactly ``/serve`` with ``{"texts": [...]}``) and the answer comes back as tensors
``label`` (BYTES), ``score`` (FP32) and ``logits`` (FP32, one row per text). A request of the
model's own tensors (``input_ids`` ...) still runs the model on them, without preprocessing.

Every other endpoint takes its model's tensors over v2; a ClearML-style ``preprocess.py`` takes
whatever JSON its author chose, which has no tensor form, so v2 there runs the model on its tensors
and ``/serve`` is the way through the user's code (docs/serving.md, "Text over v2").
"""
from __future__ import annotations

from typing import Any

import numpy as np

from serving.worker.dataplane import DataPlane
from serving.worker.errors import BadRequest
from serving.worker.frontends.v2_codec import V2Request
from serving.worker.runtime import EndpointRuntime, Target

TEXT_INPUT = "text"


def _task(ep: EndpointRuntime) -> str | None:
    return getattr(ep.processor, "task", None)


def text_io(ep: EndpointRuntime, target: Target) -> tuple[list[dict], list[dict]] | None:
    """The v2 inputs and outputs of a tokenizer endpoint (None for any other): texts in, answers out.
    An embedding endpoint answers one ``embedding`` row a text; a cross-encoder's pairs have no v2
    text form (its model's tensors still go through)."""
    if ep.preprocess_kind != "tokenizer" or _task(ep) == "rerank":
        return None
    if _task(ep) == "embed":
        return ([{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1]}],
                [{"name": "embedding", "datatype": "FP32", "shape": [-1, -1]}])
    named = getattr(ep.processor, "output", None)  # the tokenizer's --output, else the model's first
    output = next((o for o in target.outputs if o["name"] == named), target.outputs[0] if target.outputs else {})
    shape = list(output.get("shape") or [-1, -1])
    classes = shape[-1] if len(shape) > 1 else -1
    return ([{"name": TEXT_INPUT, "datatype": "BYTES", "shape": [-1]}],
            [{"name": "label", "datatype": "BYTES", "shape": [-1]},
             {"name": "score", "datatype": "FP32", "shape": [-1]},
             {"name": "logits", "datatype": "FP32", "shape": [-1, classes]}])


def _texts(name: str, array: np.ndarray) -> list[str]:
    texts = []
    for i, item in enumerate(array.ravel().tolist()):
        try:
            texts.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
        except UnicodeDecodeError:
            raise BadRequest(f"input {name!r}: element {i} is not UTF-8 text") from None
    if not texts:
        raise BadRequest(f"input {name!r} holds no text")
    return texts


def _as_tensors(answer: Any) -> dict[str, np.ndarray]:
    if "embeddings" in answer:
        return {"embedding": np.asarray(answer["embeddings"], dtype=np.float32)}
    predictions = answer["predictions"]
    labels = np.empty(len(predictions), dtype=np.object_)
    labels[:] = [str(p["label"]).encode() for p in predictions]
    return {"label": labels, "score": np.array([p["score"] for p in predictions], dtype=np.float32),
            "logits": np.array([p["logits"] for p in predictions], dtype=np.float32)}


async def infer_v2(dataplane: DataPlane, name: str, request: V2Request, version: int | None,
                   routing_key: str | None, client: str | None) -> tuple[Target, dict[str, np.ndarray]]:
    """One v2 inference, HTTP or gRPC: texts on a tokenizer endpoint, the model's tensors otherwise."""
    text = _text_input(dataplane.endpoint(name), request)
    if text is None:
        return await dataplane.infer_tensors(name, request.inputs, version, routing_key, client=client)
    answer = await dataplane.infer(name, {"texts": _texts(*text)}, version, routing_key, client=client)
    return answer.target, _as_tensors(answer.body)


def _text_input(ep: EndpointRuntime, request: V2Request) -> tuple[str, np.ndarray] | None:
    """The request's one BYTES input on a tokenizer endpoint (a tokenizer's model takes integers)."""
    if ep.preprocess_kind != "tokenizer" or _task(ep) == "rerank" or len(request.inputs) != 1:
        return None
    (name, array), = request.inputs.items()
    return (name, array) if array.dtype == np.object_ else None

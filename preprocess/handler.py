"""No preprocessing of the platform's: the request goes whole to an engine whose handler does it.

A TorchServe archive's handler (engine ``torchserve``) has its own ``preprocess`` and
``postprocess``. From ``/predictions`` the request arrives as TorchServe's frontend would hand it
over (a :class:`HandlerRequest`: the raw body or the form's fields, with content types and
headers) and its answer leaves as the handler wrote it. From ``/serve`` the JSON body is the
request's ``body`` parameter, as TorchServe's backend decodes an ``application/json`` body, and
the answer comes back as JSON.
"""
from __future__ import annotations

import uuid
from typing import Any

from preprocess.base import Collect, PreprocessError
from serving.torchserve.codec import HandlerAnswer, HandlerRequest, Parameter


class HandlerProcessor:
    outputs_form = "dict"
    has_process = False

    async def preprocess(self, body: Any, state: dict, collect: Collect) -> HandlerRequest:
        if isinstance(body, HandlerRequest):
            return body
        state["json_answer"] = True
        return HandlerRequest(request_id=str(uuid.uuid4()), parameters=[Parameter("body", body, "application/json")])

    async def process(self, data: Any, state: dict, collect: Collect) -> Any:
        raise PreprocessError("a handler endpoint runs its archive's handler (engine torchserve)")

    async def postprocess(self, data: Any, state: dict, collect: Collect) -> Any:
        if state.get("json_answer") and isinstance(data, HandlerAnswer):
            return data.value()
        return data

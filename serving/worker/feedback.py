"""Ground truth for a served request: ``POST /serve/{endpoint}/feedback`` (and v2's and OpenAI's doors)
with ``{"request_id": ..., "label": ...}`` or ``{"request_id": ..., "value": ...}``.

Why the statistics service answers it: it remembers what each logged request predicted
(serving/statistics/ground_truth.py), so it can join the label at once, and refuse one for a request it
never saw (404) or one labelled already (409) while the client is still there to be told. A worker
that cannot reach it answers 503 (retry later), never 200 for a label that went nowhere. Once joined,
the feedback is also written to the prediction log, beside the request's record (``kind``:
``feedback``), for ``serving log export --with-feedback``.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import httpx

from serving.prediction_log.writer import PredictionLog
from serving.worker.errors import BadGateway, BadRequest, NotFound, ServingError, Unavailable
from serving.errors import Conflict

MAX_ID = 128


def checked(body: Any) -> dict[str, Any]:
    """The feedback body, or a 400 naming what is wrong with it."""
    if not isinstance(body, dict):
        raise BadRequest("feedback is a JSON object: {\"request_id\": ..., \"label\": ...} or {..., \"value\": ...}")
    request_id = body.get("request_id")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_ID:
        raise BadRequest(f"'request_id' must be the answer's X-Request-Id (1 to {MAX_ID} characters)")
    label, value = body.get("label"), body.get("value")
    if (label is None) == (value is None):
        raise BadRequest("feedback needs exactly one of 'label' (the true class) or 'value' (the true number)")
    if label is not None and not isinstance(label, (str, int)) or isinstance(label, bool):
        raise BadRequest(f"'label' must be a string or an integer, not {label!r}")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)):
        raise BadRequest(f"'value' must be a finite number, not {value!r}")
    return {"request_id": request_id, **({"label": label} if label is not None else {"value": value})}


class FeedbackClient:
    def __init__(self, url: str | None, token: Callable[[], str | None], timeout_s: float = 5.0) -> None:
        self.url = None if url is None else url.rstrip("/") + "/feedback"
        self.token, self.timeout_s = token, timeout_s
        self.log: PredictionLog | None = None
        self._client = httpx.AsyncClient(timeout=timeout_s)

    async def send(self, endpoint: str, body: Any, client: str | None = None) -> dict[str, Any]:
        feedback = checked(body)
        if self.url is None:
            raise Unavailable("feedback needs the statistics service, which is off on this worker "
                              "(SERVING_STATISTICS_ENABLED=false)")
        token = self.token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            r = await self._client.post(self.url, json={"endpoint": endpoint, **feedback}, headers=headers)
        except httpx.HTTPError as exc:
            raise Unavailable(f"the statistics service, which joins feedback, is unreachable: {exc}") from None
        if r.status_code != 200:
            raise _error(r)
        joined = r.json()
        if self.log is not None:
            self.log.offer({"kind": "feedback", "ts": time.time(), "endpoint": endpoint, **feedback,
                            "version": joined.get("version"), "prediction": joined.get("prediction"),
                            **({"client": client} if client else {})})
        return joined

    async def close(self) -> None:
        await self._client.aclose()


def _error(r: httpx.Response) -> ServingError:
    try:
        detail = r.json().get("detail") or r.text
    except ValueError:
        detail = r.text
    kinds: dict[int, type[ServingError]] = {400: BadRequest, 404: NotFound, 409: Conflict}
    if r.status_code in kinds:
        return kinds[r.status_code](str(detail))
    if r.status_code in (401, 403):
        return BadGateway(f"the statistics service refused this worker's token ({r.status_code}): {detail}")
    return Unavailable(f"the statistics service answered {r.status_code}: {detail}")

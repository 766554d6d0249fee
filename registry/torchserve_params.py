"""The parameters of TorchServe's management calls, read as TorchServe reads them.

Registration takes them in the query string or, with ``Content-Type: application/json``, as a JSON
object with the same names; booleans are ``true`` in any case, anything else false; a number that is
not one is TorchServe's 400. Only what the platform applies is read: the batching options go to the
endpoint's engine options (serving/torchserve/options.py), ``initial_workers`` to its ``workers``.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from fastapi import Request

from registry.torchserve_models import bad_request
from serving.torchserve.archive import ArchiveInfo
from serving.torchserve.options import OptionError, check_options

# registration parameter -> the endpoint's engine option it sets
REGISTER_OPTIONS = {"batch_size": "batch_size", "max_batch_delay": "max_batch_delay",
                    "response_timeout": "response_timeout", "initial_workers": "workers"}
DEFAULT_STARTUP_TIMEOUT_S = 120  # TorchServe's startup_timeout: how long synchronous=true waits here
MAX_STARTUP_TIMEOUT_S = 3600


async def register_params(request: Request) -> dict[str, str]:
    """The query string, or the JSON body's fields when one is sent as JSON (TorchServe reads either)."""
    mime = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if mime != "application/json":
        return dict(request.query_params)
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise bad_request(f"the request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object of registration parameters (url, model_name, ...)")
    return {str(k): ("true" if v is True else "false" if v is False else str(v)) for k, v in body.items()
            if v is not None}


def whole(params: Mapping[str, str], name: str, default: int | None = None) -> int | None:
    value = params.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value.strip())
    except ValueError:
        raise bad_request(f"Invalid parameter {name}: {value!r} is not a whole number") from None


def flag(params: Mapping[str, str], name: str) -> bool:
    return str(params.get(name, "")).strip().lower() == "true"


def register_options(params: Mapping[str, str]) -> dict[str, int]:
    """Engine options from registration parameters that are set (TorchServe's -1 and initial_workers=0
    mean its default: the archive's model-config.yaml, else TorchServe's)."""
    chosen: dict[str, Any] = {}
    for param, option in REGISTER_OPTIONS.items():
        value = whole(params, param)
        if value is None or (value == -1 and param != "initial_workers") or (value == 0 and param == "initial_workers"):
            continue
        chosen[option] = value
    try:
        return check_options(chosen)
    except OptionError as exc:
        raise bad_request(_named(str(exc))) from None


def _named(message: str) -> str:
    """An option error in the registration's words (``workers`` is what ``initial_workers`` sets)."""
    return message.replace("torchserve option workers", "initial_workers").replace("torchserve option ", "")


def startup_timeout(params: Mapping[str, str]) -> float:
    value = whole(params, "startup_timeout", DEFAULT_STARTUP_TIMEOUT_S)
    if value is None or not 0 <= value <= MAX_STARTUP_TIMEOUT_S:
        raise bad_request(f"startup_timeout must be between 0 and {MAX_STARTUP_TIMEOUT_S} seconds, not {value}")
    return float(value)


def check_archive_overrides(params: Mapping[str, str], info: ArchiveInfo) -> None:
    """``runtime`` and ``handler`` override the manifest in TorchServe. Here the worker runs what the archive
    says, so they are accepted when they say the same (python; the manifest's own handler) and refused otherwise."""
    runtime = params.get("runtime")
    if runtime and runtime.strip().lower() != "python":
        raise bad_request(f"runtime {runtime!r} is not served here: only python handlers run (the archive's runtime "
                          f"is {info.runtime})")
    handler = params.get("handler")
    if handler and handler not in (info.handler, info.handler.rsplit("/", 1)[-1]):
        raise bad_request(f"handler {handler!r} differs from the archive's own ({info.handler}); another handler "
                          "is not loaded at registration here: archive the model with it (torch-model-archiver "
                          "--handler)")


def scale_workers(params: Mapping[str, str]) -> int:
    """``min_worker`` (TorchServe's default 1) as the ``workers`` option; ``max_worker`` only checked against it:
    the handler processes of a worker process are a fixed number, not scaled between bounds."""
    low = whole(params, "min_worker", 1)
    high = whole(params, "max_worker", low)
    if high < low:
        raise bad_request("max_worker cannot be less than min_worker.")
    if low < 1:
        raise bad_request(f"min_worker {low}: a registered version keeps at least one handler process in each worker "
                          "process; unregister it (DELETE /models/NAME/VERSION) to stop it")
    try:
        return check_options({"workers": low})["workers"]
    except OptionError as exc:
        raise bad_request(_named(str(exc)).replace("initial_workers", "min_worker")) from None

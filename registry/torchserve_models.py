"""TorchServe's models seen through the registry: what the management API (registry/torchserve_api.py)
reads, and the errors it answers in TorchServe's shape.

The mapping, chosen so that TorchServe's workers and ours mean the same things:

* a TorchServe *model* is an endpoint of engine ``torchserve`` named after it (``/predictions/NAME``
  on the workers answers it); endpoints of other engines are not TorchServe models here;
* its *versions* are the endpoint's live targets (a shadow only gets copies: not a version), each a
  registry version whose archive carries TorchServe's version string (``--version``, kept in the
  signature as ``torchserve.model_version``); a path's ``{version}`` is that string or our version
  number, as ``/predictions/NAME/VERSION`` takes it;
* the *default version* is the stable target, routed 100%; every other version is a canary target
  routed 0%: loaded by the workers (readiness gates it), answering only when asked by version;
* the worker counts are the endpoint's ``workers`` engine option: handler processes in each worker
  process (serving/torchserve/options.py), so ``minWorkers`` = ``maxWorkers`` = that number.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from registry.orm import Endpoint, EndpointTarget, ModelVersion
from serving.torchserve.archive import ArchiveInfo
from serving.torchserve.options import effective

ENGINE = "torchserve"
PAGE_MAX = 100  # TorchServe's largest (and default) page of GET /models
URL_KEY = "torchserve_url"  # the model version's metadata key holding the url it was registered from


class ManagementError(Exception):
    """An answer in TorchServe's error shape: ``{"code", "type", "message"}``."""

    def __init__(self, status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.message, self.headers = status, kind, message, headers or {}

    def body(self) -> dict[str, Any]:
        return {"code": self.status, "type": self.kind, "message": self.message}


def model_not_found(name: str) -> ManagementError:
    return ManagementError(404, "ModelNotFoundException", f"Model not found: {name}")


def version_not_found(name: str, version: str) -> ManagementError:
    return ManagementError(404, "ModelVersionNotFoundException",
                           f"Model version: {version} does not exist for model: {name}")


def bad_request(message: str) -> ManagementError:
    return ManagementError(400, "BadRequestException", message)


def conflict(message: str) -> ManagementError:
    return ManagementError(409, "ConflictStatusException", message)


def version_label(model: ModelVersion) -> str:
    """TorchServe's version string of a registry version: its archive's ``--version``, else our number."""
    info = (model.signature or {}).get(ENGINE) or {}
    return str(info.get("model_version") or model.version)


def live_targets(ep: Endpoint) -> list[EndpointTarget]:
    """The versions TorchServe would list: every target but a shadow, in version order."""
    return sorted((t for t in ep.targets if t.role != "shadow"), key=lambda t: t.model.version)


def default_target(ep: Endpoint) -> EndpointTarget | None:
    """The stable target; an endpoint made elsewhere without one: its most weighted version."""
    live = live_targets(ep)
    stable = [t for t in live if t.role == "stable"]
    if stable:
        return stable[-1]
    return max(live, key=lambda t: (t.weight, t.model.version), default=None)


def find_target(ep: Endpoint, version: str | None) -> EndpointTarget:
    """The target a path names: none -> the default; our version number first (as the workers'
    ``/predictions/NAME/N`` reads it), else TorchServe's version string (the newest with it)."""
    if version is None:
        target = default_target(ep)
        if target is None:
            raise model_not_found(ep.name)
        return target
    live = live_targets(ep)
    if version.isascii() and version.isdigit():
        numbered = [t for t in live if t.model.version == int(version)]
        if numbered:
            return numbered[0]
    labelled = [t for t in live if version_label(t.model) == version]
    if not labelled:
        raise version_not_found(ep.name, version)
    return labelled[-1]


def is_torchserve(ep: Endpoint | None) -> bool:
    return ep is not None and ep.engine == ENGINE


def model_url(model: ModelVersion) -> str:
    """What TorchServe shows as ``modelUrl``: the url the version was registered from; a version
    registered through the platform's own API has none, so its registry name instead."""
    return str((model.meta or {}).get(URL_KEY) or f"{model.name}:{model.version}")


def list_page(endpoints: list[Endpoint], limit: int, token: int) -> dict[str, Any]:
    """``GET /models``: the TorchServe models by name, each with its default version's url; a
    ``nextPageToken`` (an offset) while more remain. Limits outside 1..100 mean 100, as TorchServe's."""
    limit = limit if 0 < limit <= PAGE_MAX else PAGE_MAX
    token = max(token, 0)
    models = sorted((ep for ep in endpoints if is_torchserve(ep) and default_target(ep)), key=lambda e: e.name)
    page = models[token:token + limit]
    answer: dict[str, Any] = {}
    if token + limit < len(models):
        answer["nextPageToken"] = str(token + limit)
    answer["models"] = [{"modelName": ep.name, "modelUrl": model_url(default_target(ep).model)} for ep in page]
    return answer


@dataclass(frozen=True)
class WorkerLine:
    """One worker process's readiness line (registry/readiness.py), as describe reads it."""

    source: str
    state: str
    serving: tuple[int, ...]
    error: str | None

    @classmethod
    def from_status(cls, line: dict[str, Any]) -> "WorkerLine":
        serving = tuple(int(entry[0]) for entry in line.get("serving") or [] if entry)
        return cls(str(line.get("source", "")), str(line.get("state", "pending")), serving, line.get("error"))

    @property
    def pid(self) -> int | None:
        tail = self.source.rpartition(":")[2]
        return int(tail) if tail.isdigit() else None


def describe(ep: Endpoint, target: EndpointTarget, lines: list[WorkerLine]) -> dict[str, Any]:
    """One entry of TorchServe's describe answer for one version. ``workers``: one entry per handler
    process of each worker process (``workers`` of them in each), READY once that worker process
    routes the version, FAILED when it could not load it, LOADING meanwhile."""
    model = target.model
    info = ArchiveInfo.from_signature(model.signature or {})
    values = effective(info, ep.engine_options or {})
    return {
        "modelName": ep.name,
        "modelVersion": version_label(model),
        "modelUrl": model_url(model),
        "runtime": info.runtime or "python",
        "minWorkers": values["workers"],
        "maxWorkers": values["workers"],
        "batchSize": values["batch_size"],
        "maxBatchDelay": values["max_batch_delay"],
        "responseTimeout": values["response_timeout"],
        "loadedAtStartup": False,
        "isDefault": target is default_target(ep),
        "registryVersion": model.version,
        "handler": info.handler,
        "workers": [worker for line in lines for worker in _handler_workers(line, model.version, values["workers"])],
    }


def _handler_workers(line: WorkerLine, version: int, count: int) -> list[dict[str, Any]]:
    if version in line.serving:
        status = "READY"
    else:
        status = "FAILED" if line.state == "failed" else "LOADING"
    entry: dict[str, Any] = {"status": status, "source": line.source, **({"pid": line.pid} if line.pid else {})}
    if status == "FAILED" and line.error:
        entry["error"] = line.error
    return [{"id": f"{line.source}/{i}", **entry} for i in range(count)]

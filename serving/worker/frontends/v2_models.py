"""What the v2 protocol says about the server and its models, for every transport (HTTP, gRPC).

A v2 "model" is an endpoint; its versions are the endpoint's model versions, and its tensors
are a version's signature (a live version unless one is named).
"""
from __future__ import annotations

from serving import __version__
from serving.worker.dataplane import DataPlane
from serving.worker.errors import NotFound, Unavailable
from serving.worker.frontends.serve_rest import parse_version
from serving.worker.runtime import Target

SERVER_METADATA = {"name": "serving", "version": __version__, "extensions": ["binary_tensor_data"]}


def tensors(specs: tuple[dict, ...]) -> list[dict]:
    return [{"name": s["name"], "datatype": s["dtype"], "shape": s.get("shape", [])} for s in specs]


def check_server_ready(dataplane: DataPlane) -> None:
    if not dataplane.config.current.loaded:
        raise Unavailable("no configuration yet: the control plane is unreachable and there is no cache")


def metadata_target(dataplane: DataPlane, name: str, version: str | None) -> Target:
    ep = dataplane.endpoint(name)
    if not ep.targets:
        raise NotFound(f"endpoint {name!r} serves no model version; it has no tensor metadata")
    return dataplane.route(ep, parse_version(version), None) if version else ep.targets[0]


def model_metadata(dataplane: DataPlane, name: str, version: str | None) -> dict:
    target = metadata_target(dataplane, name, version)
    ep = dataplane.endpoint(name)
    return {"name": name, "versions": [str(t.version) for t in ep.targets], "platform": ep.engine,
            "inputs": tensors(target.inputs), "outputs": tensors(target.outputs)}


async def check_model_ready(dataplane: DataPlane, name: str, version: str | None) -> None:
    """Unknown endpoint or version: NotFound; any version not loaded in its engine yet: Unavailable."""
    if version:
        dataplane.route(dataplane.endpoint(name), parse_version(version), None)
    if not await dataplane.ready(name):
        raise Unavailable(f"model {name!r} is not ready: its engine has not loaded every version yet")

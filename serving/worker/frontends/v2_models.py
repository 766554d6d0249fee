"""What the v2 protocol says about the server and its models, for every transport (HTTP, gRPC).

A v2 "model" is an endpoint; its versions are the endpoint's model versions, and its tensors
are a version's signature (a live version unless one is named).
"""
from __future__ import annotations

from serving import __version__
from serving.triton.model_formats import FORMATS
from serving.worker.dataplane import DataPlane
from serving.worker.errors import Forbidden, NotFound, Unavailable
from serving.worker.frontends.serve_rest import parse_version
from serving.worker.frontends.v2_text import text_io
from serving.worker.runtime import Target
from serving.worker.version_stats import model_stats

SERVER_METADATA = {"name": "serving", "version": __version__, "extensions": ["binary_tensor_data", "statistics"]}


def tensors(specs: tuple[dict, ...]) -> list[dict]:
    return [{"name": s["name"], "datatype": s["dtype"], "shape": s.get("shape", [])} for s in specs]


def platform_backend(engine: str, target: Target) -> tuple[str, str]:
    """The ``platform`` and ``backend`` Triton's config.pbtxt would hold for the version answering: on
    engine ``triton`` its format's (``tensorrt_plan``/``tensorrt``, ""/``python``, ...); on engine
    ``onnxruntime`` ONNX's; for the other in-worker engines (sklearn, xgboost, lightgbm, custom), which
    Triton has no name for, no platform and the engine as the backend."""
    fmt = FORMATS.get(target.framework) if engine == "triton" else FORMATS["onnx"] if engine == "onnxruntime" else None
    return (fmt.platform, fmt.backend) if fmt else ("", engine)


def platform(engine: str, target: Target) -> str:
    """Triton's metadata ``platform``: the config's platform, else its backend (Triton says ``python``)."""
    plat, backend = platform_backend(engine, target)
    return plat or backend


def check_server_ready(dataplane: DataPlane) -> None:
    if not dataplane.config.current.loaded:
        raise Unavailable("no configuration yet: the control plane is unreachable and there is no cache")


def metadata_target(dataplane: DataPlane, name: str, version: str | None) -> Target:
    ep = dataplane.endpoint(name)
    if not ep.targets:
        raise NotFound(f"endpoint {name!r} serves no model version; it has no tensor metadata")
    return dataplane.route(ep, parse_version(version), None) if version else ep.targets[0]


def model_metadata(dataplane: DataPlane, name: str, version: str | None) -> dict:
    """A version's tensors; on a tokenizer endpoint the text in and the answer out (v2_text.py)."""
    target = metadata_target(dataplane, name, version)
    ep = dataplane.endpoint(name)
    io = text_io(ep, target) or (tensors(target.inputs), tensors(target.outputs))
    return {"name": name, "versions": [str(t.version) for t in ep.targets], "platform": platform(ep.engine, target),
            "inputs": io[0], "outputs": io[1]}


async def model_statistics(dataplane: DataPlane, name: str | None, version: str | None) -> dict:
    """Triton's statistics of every version of every endpoint (no ``name``), of one endpoint, or of one
    of its versions (version_stats.py). The caller checked the client key for ``name``; without a name
    and with keys required there is no one endpoint to check a key against: refused."""
    config = dataplane.config.current
    if not name:
        if dataplane.keys.required:
            raise Forbidden("with client keys required, ask for one endpoint's statistics: "
                            "/v2/models/{name}/stats (gRPC: ModelStatistics with a name)")
        pairs = [(n, t.version) for n, ep in config.endpoints.items() for t in ep.targets]
    else:
        ep = dataplane.endpoint(name, config)
        targets = [dataplane.route(ep, parse_version(version), None)] if version else list(ep.targets)
        pairs = [(name, t.version) for t in targets]
    return model_stats(await dataplane.version_stats.gather(), pairs)


async def check_model_ready(dataplane: DataPlane, name: str, version: str | None) -> None:
    """Unknown endpoint or version: NotFound; any version not loaded in its engine yet: Unavailable."""
    if version:
        dataplane.route(dataplane.endpoint(name), parse_version(version), None)
    if not await dataplane.ready(name):
        raise Unavailable(f"model {name!r} is not ready: its engine has not loaded every version yet")

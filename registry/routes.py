"""An endpoint's routes (its weighted targets) as each kind of deploy sets them: one version, a canary
beside the stable one, the newest N versions of an auto-update endpoint; and declared tensors checked
against the model being routed to. Called inside a registry write transaction."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from registry import formats, io_spec, schemas
from registry.errors import BadRequest, Conflict, NotFound, Unprocessable
from registry.orm import Endpoint, EndpointTarget, ModelVersion
from serving.triton.shapes import batch_size


def declared_io(decl: schemas.IODeclaration, batching: dict, model: ModelVersion | None) -> dict:
    max_batch = int(batching.get("max_batch_size") or 0)
    if model is not None and "max_batch_size" in (model.signature or {}):  # fixed by the model's own config.pbtxt
        max_batch = batch_size(batching, model.signature)
    try:
        io = io_spec.normalize(decl, max_batch)
        if model is not None:
            io_spec.check_against(io, model.signature or {}, f"{model.name}:{model.version}")
    except io_spec.IOMismatch as exc:
        raise Unprocessable(str(exc)) from None
    return io


def route_newest(s: Session, ep: Endpoint, external_triton: bool = False) -> list[dict]:
    """The newest ``max_versions`` versions the endpoint's engine can run; the newest takes all traffic
    unless weights were set. A newer version it cannot run (a TensorRT plan on the embedded Triton) is
    skipped by the check ``model add`` applies (registry/formats.py), so the versions that answer keep
    answering rather than a load failing on the workers; the skipped ones, with why, are kept in
    ``auto_update["skipped"]`` (the endpoint's answer) and returned."""
    policy = ep.auto_update
    versions, skipped = [], []
    for m in s.scalars(select(ModelVersion).where(ModelVersion.name == policy["model"])
                       .order_by(ModelVersion.version.desc())):
        if len(versions) == policy["max_versions"]:
            break
        try:
            formats.deployable_format(ep.engine, m.framework, f"{m.name}:{m.version}",
                                      (ep.batching or {}).get("triton_config"), external_triton)
            formats.tensors_known(ep.engine, m, ep.io)
            versions.insert(0, m)
        except (BadRequest, Unprocessable) as exc:
            skipped.append({"version": m.version, "reason": exc.message})
    ep.auto_update = {**policy, "skipped": skipped}
    if not versions:
        if ep.targets and skipped:  # nothing newer it can run: the versions answering stay
            return skipped
        raise (Unprocessable(skipped[0]["reason"]) if skipped else NotFound(f"model {policy['model']} has no versions"))
    weights = [0.0] * len(versions)
    chosen = policy.get("weights") or [100.0]
    for i, w in enumerate(chosen[::-1]):  # the last weight goes to the newest version
        if i < len(versions):
            weights[-1 - i] = w
    total = sum(weights) or 1.0
    ep.targets.clear()
    s.flush()
    for i, (m, w) in enumerate(zip(versions, weights)):
        ep.targets.append(EndpointTarget(model=m, weight=100.0 * w / total,
                                         role="stable" if i == len(versions) - 1 else "canary"))
    return skipped


def route(ep: Endpoint, model: ModelVersion, canary: float | None) -> None:
    """Without a canary the version replaces all targets; with one it takes `canary`%
    and the current stable version the rest."""
    session = object_session(ep)
    if canary is None:
        ep.targets.clear()
        session.flush()  # delete before insert: (endpoint, model) is unique
        ep.targets.append(EndpointTarget(model=model, weight=100.0, role="stable"))
        return
    stable = next((t for t in ep.targets if t.role == "stable"), None)
    if stable is None:
        raise Conflict(f"endpoint {ep.name} has no stable version to split traffic with")
    if stable.model_id == model.id:
        raise Conflict(f"{model.name}:{model.version} is already the stable version of {ep.name}")
    for t in [t for t in ep.targets if t is not stable and (t.role != "shadow" or t.model_id == model.id)]:
        ep.targets.remove(t)  # a shadow of another version keeps shadowing
    session.flush()
    stable.weight = 100.0 - canary
    ep.targets.append(EndpointTarget(model=model, weight=float(canary), role="canary"))

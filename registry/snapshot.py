"""The config snapshot pushed to workers (format in docs/architecture.md)."""
from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from registry.client_keys import snapshot_keys
from registry.orm import ConfigState, Endpoint, EndpointTarget
from serving.triton.naming import triton_model_name


def _target(t: EndpointTarget) -> dict:
    m = t.model
    return {
        "model": m.name, "version": m.version, "weight": t.weight, "role": t.role,
        "triton_name": triton_model_name(m.name, m.version), "artifact": m.sha256,
        "framework": m.framework, "signature": m.signature,
    }


def _metric(m) -> dict:
    return {"name": m.name, "kind": m.kind, **m.spec}


def _endpoint(ep: Endpoint) -> dict:
    return {
        "name": ep.name, "engine": ep.engine, "preprocess": ep.preprocess or {"kind": "none"},
        "batching": ep.batching, "targets": [_target(t) for t in ep.targets],
        "metrics": [_metric(m) for m in ep.metrics], "log_freq": ep.log_freq, "io": ep.io or {},
        "engine_options": ep.engine_options or {},
        "prediction_log": ep.prediction_log,
    }


def build_snapshot(s: Session) -> dict:
    """Read revision, endpoints and client keys in one transaction so they agree."""
    revision = s.scalar(select(ConfigState.revision).where(ConfigState.id == 1)) or 0
    q = select(Endpoint).options(
        selectinload(Endpoint.targets).selectinload(EndpointTarget.model), selectinload(Endpoint.metrics)
    )
    endpoints = {ep.name: _endpoint(ep) for ep in s.scalars(q)}
    return {"revision": revision, "endpoints": endpoints, "client_keys": snapshot_keys(s)}

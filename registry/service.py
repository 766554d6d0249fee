"""Registry operations. Each write bumps the config revision in the same transaction,
so a snapshot's revision always names exactly one state of the registry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, object_session, selectinload, sessionmaker

from registry import schemas
from registry.artifacts import ArtifactStore
from registry.orm import ConfigState, Endpoint, EndpointTarget, MetricDefinition, ModelVersion
from registry.signature import onnx_signature


class RegistryError(Exception):
    status = 400


class NotFound(RegistryError):
    status = 404


class Conflict(RegistryError):
    status = 409


@dataclass
class Registry:
    sessions: sessionmaker
    store: ArtifactStore
    on_change: Callable[[], None] = lambda: None

    # --- revision -------------------------------------------------------------
    def revision(self) -> int:
        with self.sessions() as s:
            return _revision(s)

    def _commit(self, s: Session) -> None:
        if s.execute(update(ConfigState).values(revision=ConfigState.revision + 1)).rowcount == 0:
            s.add(ConfigState(id=1, revision=1))
        s.commit()
        self.on_change()

    # --- models ---------------------------------------------------------------
    def add_model(self, req: schemas.ModelCreate) -> ModelVersion:
        if not self.store.exists(req.artifact):
            raise NotFound(f"artifact {req.artifact} was not uploaded")
        path = self.store.path(req.artifact)
        if req.signature is not None:
            signature = req.signature.model_dump()
        elif req.framework == "onnx":
            signature = onnx_signature(path)
        else:
            signature = {"inputs": [], "outputs": []}
        with self.sessions() as s:
            latest = s.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.name == req.name))
            mv = ModelVersion(
                name=req.name, version=(latest or 0) + 1, framework=req.framework, sha256=req.artifact,
                size=path.stat().st_size, signature=signature, tags=req.tags, meta=req.metadata,
            )
            s.add(mv)
            self._commit(s)
            return mv

    def list_models(self, name: str | None = None) -> list[ModelVersion]:
        with self.sessions() as s:
            q = select(ModelVersion).order_by(ModelVersion.name, ModelVersion.version)
            if name:
                q = q.where(ModelVersion.name == name)
            return list(s.scalars(q))

    def remove_model(self, name: str, version: int | None) -> int:
        with self.sessions() as s:
            q = select(ModelVersion).where(ModelVersion.name == name)
            if version is not None:
                q = q.where(ModelVersion.version == version)
            models = list(s.scalars(q))
            if not models:
                raise NotFound(f"model {name}" + (f":{version}" if version else "") + " not found")
            ids = [m.id for m in models]
            used = s.scalars(select(Endpoint.name).join(EndpointTarget).where(EndpointTarget.model_id.in_(ids)))
            in_use = sorted(set(used))
            if in_use:
                raise Conflict(f"model {name} is deployed on endpoint(s) {', '.join(in_use)}; remove it there first")
            for m in models:
                s.delete(m)
            self._commit(s)
            return len(models)

    # --- endpoints --------------------------------------------------------------
    def deploy(self, req: schemas.EndpointDeploy) -> Endpoint:
        with self.sessions() as s:
            model = _model(s, req.model, req.version)
            self._check_deployable(req, model)
            ep = s.scalar(select(Endpoint).where(Endpoint.name == req.endpoint))
            if ep is None:
                if req.canary is not None:
                    raise NotFound(f"endpoint {req.endpoint} does not exist; a canary needs a current version")
                ep = Endpoint(name=req.endpoint, engine=req.engine, preprocess={}, batching={}, log_freq=1.0)
                s.add(ep)
            ep.engine = req.engine
            if req.preprocess is not None:
                ep.preprocess = req.preprocess.model_dump()
            if req.batching is not None or not ep.batching:
                ep.batching = (req.batching or schemas.Batching()).model_dump()
            _route(ep, model, req.canary)
            self._commit(s)
            return self._endpoint(s, req.endpoint)

    def _check_deployable(self, req: schemas.EndpointDeploy, model: ModelVersion) -> None:
        if req.engine in ("triton", "onnxruntime") and model.framework != "onnx":
            raise RegistryError(f"engine {req.engine} serves ONNX models; {model.name}:{model.version} is {model.framework}")
        pre = req.preprocess
        if pre is not None and pre.artifact and not self.store.exists(pre.artifact):
            raise NotFound(f"preprocess artifact {pre.artifact} was not uploaded")

    def set_weights(self, name: str, req: schemas.CanaryWeights) -> Endpoint:
        with self.sessions() as s:
            ep = self._endpoint(s, name)
            by_version = {t.model.version: t for t in ep.targets}
            unknown = sorted(set(req.weights) - set(by_version))
            if unknown:
                raise NotFound(f"endpoint {name} has no target version(s) {unknown}; it routes {sorted(by_version)}")
            for version, target in by_version.items():
                target.weight = float(req.weights.get(version, 0.0))
            self._commit(s)
            return self._endpoint(s, name)

    def promote(self, name: str) -> Endpoint:
        """The canary becomes the only (stable) target."""
        return self._keep(name, "canary")

    def rollback(self, name: str) -> Endpoint:
        """The stable version takes all traffic again; canaries are dropped."""
        return self._keep(name, "stable")

    def _keep(self, name: str, role: str) -> Endpoint:
        with self.sessions() as s:
            ep = self._endpoint(s, name)
            keep = [t for t in ep.targets if t.role == role]
            if not keep or len(ep.targets) < 2:
                raise Conflict(f"endpoint {name} has no canary in progress")
            for t in list(ep.targets):
                if t is not keep[-1]:
                    ep.targets.remove(t)
            keep[-1].role, keep[-1].weight = "stable", 100.0
            self._commit(s)
            return self._endpoint(s, name)

    def list_endpoints(self) -> list[Endpoint]:
        with self.sessions() as s:
            q = select(Endpoint).order_by(Endpoint.name).options(
                selectinload(Endpoint.targets).selectinload(EndpointTarget.model), selectinload(Endpoint.metrics))
            return list(s.scalars(q))

    def get_endpoint(self, name: str) -> Endpoint:
        with self.sessions() as s:
            return self._endpoint(s, name)

    def remove_endpoint(self, name: str) -> None:
        with self.sessions() as s:
            s.delete(self._endpoint(s, name))
            self._commit(s)

    def set_log_freq(self, name: str, freq: float) -> None:
        with self.sessions() as s:
            self._endpoint(s, name).log_freq = freq
            self._commit(s)

    # --- metric definitions -----------------------------------------------------------
    def add_metric(self, endpoint: str, req: schemas.MetricCreate) -> None:
        with self.sessions() as s:
            ep = self._endpoint(s, endpoint)
            spec = {"buckets": req.buckets} if req.kind == "scalar" else {"values": req.values} if req.kind == "enum" else {}
            existing = next((m for m in ep.metrics if m.name == req.name), None)
            if existing is None:
                ep.metrics.append(MetricDefinition(name=req.name, kind=req.kind, spec=spec))
            else:
                existing.kind, existing.spec = req.kind, spec
            self._commit(s)

    def remove_metric(self, endpoint: str, name: str) -> None:
        with self.sessions() as s:
            ep = self._endpoint(s, endpoint)
            metric = next((m for m in ep.metrics if m.name == name), None)
            if metric is None:
                raise NotFound(f"endpoint {endpoint} has no metric {name}")
            ep.metrics.remove(metric)
            self._commit(s)

    @staticmethod
    def _endpoint(s: Session, name: str) -> Endpoint:
        ep = s.scalar(select(Endpoint).where(Endpoint.name == name))
        if ep is None:
            raise NotFound(f"endpoint {name} not found")
        for t in ep.targets:  # load while the session is open
            _ = t.model
        _ = ep.metrics
        return ep


def _revision(s: Session) -> int:
    return s.scalar(select(ConfigState.revision).where(ConfigState.id == 1)) or 0


def _model(s: Session, name: str, version: int | None) -> ModelVersion:
    q = select(ModelVersion).where(ModelVersion.name == name)
    q = q.where(ModelVersion.version == version) if version else q.order_by(ModelVersion.version.desc())
    model = s.scalars(q).first()
    if model is None:
        raise NotFound(f"model {name}" + (f":{version}" if version else "") + " not found")
    return model


def _route(ep: Endpoint, model: ModelVersion, canary: float | None) -> None:
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
    for t in [t for t in ep.targets if t is not stable]:
        ep.targets.remove(t)
    session.flush()
    stable.weight = 100.0 - canary
    ep.targets.append(EndpointTarget(model=model, weight=float(canary), role="canary"))

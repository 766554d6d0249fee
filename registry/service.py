"""Registry operations. Each write bumps the config revision in the same transaction,
so a snapshot's revision always names exactly one state of the registry."""
from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm.exc import StaleDataError
from sqlalchemy.orm import Session, selectinload, sessionmaker

from registry import formats, io_spec, pytorch_models, schemas
from registry.artifacts import ArtifactStore
from registry.errors import BadRequest, Conflict, NotFound, RegistryError, Unprocessable  # noqa: F401 (re-exported)
from registry.lora_engines import join_base_engine
from registry.orm import ConfigState, Endpoint, EndpointTarget, MetricDefinition, ModelVersion
from registry.routes import declared_io, route, route_newest
from registry.signature import onnx_signature, refuse_pytorch

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_VERSION = 2**31 - 1  # model_versions.version is a 32-bit integer on PostgreSQL
WRITE_ATTEMPTS = 30  # a write that loses a race is run again from the start, this many times at most


def _retriable(exc: Exception) -> bool:
    """A lost race, not a bad request: a unique key taken meanwhile, a row changed or deleted
    under us, SQLite's write lock busy, PostgreSQL's serialization/deadlock errors."""
    if isinstance(exc, (IntegrityError, StaleDataError)):
        return True
    if isinstance(exc, OperationalError):
        text = str(exc.orig).lower()
        return any(m in text for m in ("database is locked", "deadlock", "could not serialize", "busy"))
    return False


@dataclass
class Registry:
    sessions: sessionmaker
    store: ArtifactStore
    on_change: Callable[[], None] = lambda: None  # after each committed change
    # in each change's transaction, before its commit: PostgreSQL's NOTIFY to the other replicas (config_notify.py)
    announce: Callable[[Session], None] = lambda s: None
    external_triton: bool = False  # SERVING_TRITON_MODEL_REPOSITORY set: engine triton is a full Triton (registry/formats.py)
    per_model_installs: bool = False  # SERVING_INSTALL_PY_DEP_PER_MODEL: an archive's requirements.txt is installed

    # --- revision -------------------------------------------------------------
    def revision(self) -> int:
        with self.sessions() as s:
            return _revision(s)

    def _commit(self, s: Session) -> None:
        if not s.info.pop("revision_bumped", False):
            self._bump(s)
        self.announce(s)
        s.commit()
        try:
            self.on_change()
        except Exception:  # committed: the periodic refresh will push it; the client must not see a 500
            log.exception("config refresh after a change failed")

    @staticmethod
    def _bump(s: Session) -> None:
        if s.execute(update(ConfigState).values(revision=ConfigState.revision + 1)).rowcount == 0:
            s.add(ConfigState(id=1, revision=1))
            s.flush()

    def _write(self, action: Callable[[Session], T], what: str) -> T:
        """Run ``action`` in one write transaction that takes the registry's write lock first.

        The revision row is bumped before anything is read, so writers queue on it (a row lock
        on PostgreSQL, the write lock on SQLite) and each one reads what the previous committed:
        version numbers are allocated in the database without gaps or duplicates, and a
        promote racing another promote sees it and answers 409 instead of deleting a row twice.
        Should a race slip through anyway (another replica, an older control plane), the
        transaction is rolled back and run again; a conflict that persists is a 409.
        """
        for attempt in range(WRITE_ATTEMPTS):
            try:
                with self.sessions() as s:
                    self._bump(s)
                    s.info["revision_bumped"] = True
                    result = action(s)
                    self._commit(s)
                    return result
            except RegistryError:
                raise
            except (IntegrityError, StaleDataError, OperationalError) as exc:
                if not _retriable(exc):
                    raise
                log.info("%s lost a race (attempt %d): %s", what, attempt + 1, type(exc).__name__)
                time.sleep(random.uniform(0.005, 0.05) * min(attempt + 1, 10))
        raise Conflict(f"{what} kept conflicting with concurrent changes; try again")

    # --- models ---------------------------------------------------------------
    def add_model(self, req: schemas.ModelCreate) -> ModelVersion:
        if not self.store.exists(req.artifact):
            raise NotFound(f"artifact {req.artifact} was not uploaded")
        path = self.store.path(req.artifact)
        framework = formats.upload_framework(path, req.framework)
        if framework not in (*formats.TRITON_ONLY, "torchserve"):
            refuse_pytorch(path, framework, f"model {req.name}'s file")
        if req.base is not None and framework != "hf-lora":
            raise BadRequest(f"--base names the model a LoRA adapter was trained on; {req.name}'s upload is {framework}")
        if framework == "hf-causal-lm":
            signature = _llm_signature(path)
            self._check_llm_followers(req.name, signature)
        elif framework == "hf-lora":
            signature = self._adapter_signature(path, req.base)
            self._check_llm_followers(req.name, signature)
        elif framework in pytorch_models.CHECKED_UPLOADS:  # a .pt2 or a state-dict archive (engine torch)
            signature = pytorch_models.upload_signature(path, framework, req.signature and req.signature.model_dump())
        elif req.signature is not None:
            signature = req.signature.model_dump()
        elif framework == "onnx":
            signature = onnx_signature(path)
        elif framework in formats.TRITON_ONLY:
            signature = formats.triton_signature(path, framework)
        elif framework == "torchserve":
            signature = formats.archive_signature(path, self.per_model_installs)
        else:
            signature = {"inputs": [], "outputs": []}
        size = path.stat().st_size

        def create(s: Session) -> ModelVersion:
            latest = s.scalar(select(func.max(ModelVersion.version)).where(ModelVersion.name == req.name)) or 0
            if latest >= MAX_VERSION:
                raise Conflict(f"model {req.name} has reached the last version number ({MAX_VERSION})")
            mv = ModelVersion(
                name=req.name, version=latest + 1, framework=framework, sha256=req.artifact,
                size=size, signature=signature, tags=req.tags, meta=req.metadata,
            )
            s.add(mv)
            s.flush()  # a version taken meanwhile fails here, inside the retry
            return mv

        return self._write(create, f"adding a version of model {req.name}")

    def _adapter_signature(self, path, base: str | None) -> dict:
        """A LoRA adapter's facts, checked against its base version's weights (serving/llm/adapters/peft.py);
        its base's ``llm`` facts are kept too (context, chat template: what the worker checks a request with)."""
        from serving.llm.adapters.peft import AdapterError, adapter_signature, base_weights, read_adapter

        if not base:
            raise BadRequest("a LoRA adapter needs its base: --base NAME:VERSION (the version it was trained on)")
        name, _, version = base.rpartition(":")
        if not name or not version.isdigit():
            raise BadRequest(f"--base {base!r}: give the base version as NAME:VERSION")
        with self.sessions() as s:
            model = _model(s, name, int(version))
        if model.framework != "hf-causal-lm":
            raise Unprocessable(f"the base {base} is {model.framework}, not a Hugging Face causal LM folder")
        try:
            config, tensors = read_adapter(path)
            ref = {"name": model.name, "version": model.version, "artifact": model.sha256}
            signature = adapter_signature(config, tensors, base_weights(self.store.path(model.sha256)), ref)
        except AdapterError as exc:
            raise Unprocessable(f"the adapter does not fit {base}: {exc}") from None
        return {**signature, "llm": (model.signature or {}).get("llm")}

    def _check_llm_followers(self, name: str, signature: dict) -> None:
        """A new version an auto-update vllm endpoint would serve at once is checked as a deploy is."""
        with self.sessions() as s:
            for ep in s.scalars(select(Endpoint).where(Endpoint.engine.in_(schemas.LLM_ENGINES))):
                if (ep.auto_update or {}).get("model") == name:
                    _check_llm(ModelVersion(name=name, version=0, signature=signature), ep.engine_options,
                               f" (endpoint {ep.name} follows its newest versions)")

    def list_models(self, name: str | None = None) -> list[ModelVersion]:
        with self.sessions() as s:
            q = select(ModelVersion).order_by(ModelVersion.name, ModelVersion.version)
            if name:
                q = q.where(ModelVersion.name == name)
            return list(s.scalars(q))

    def remove_model(self, name: str, version: int | None) -> int:
        def remove(s: Session) -> int:
            q = select(ModelVersion).where(ModelVersion.name == name)
            if version is not None:
                q = q.where(ModelVersion.version == version)
            models = list(s.scalars(q))
            if not models:
                raise NotFound(f"model {name}" + (f":{version}" if version else "") + " not found")
            ids = [m.id for m in models]
            used = s.scalars(select(Endpoint.name).join(EndpointTarget).where(EndpointTarget.model_id.in_(ids)))
            in_use = sorted(set(used) | _adapters_on(s, models))
            if in_use:
                raise Conflict(f"model {name} is deployed on endpoint(s) {', '.join(in_use)}; remove it there first")
            for m in models:
                s.delete(m)
            s.flush()
            return len(models)

        return self._write(remove, f"removing model {name}")

    # --- endpoints --------------------------------------------------------------
    def deploy(self, req: schemas.EndpointDeploy) -> Endpoint:
        if req.engine is None:
            req = req.model_copy(update={"engine": self._implied_engine(req)})
        if req.shadow is not None:  # a copy of req.shadow% of the requests, never an answer
            return self.set_shadow(req)

        def put(s: Session) -> None:
            model = _model(s, req.model, req.version) if req.model else None
            self._check_deployable(req, model)
            ep = s.scalar(select(Endpoint).where(Endpoint.name == req.endpoint))
            if ep is None:
                if req.canary is not None:
                    raise NotFound(f"endpoint {req.endpoint} does not exist; a canary needs a current version")
                ep = Endpoint(name=req.endpoint, engine=req.engine, preprocess={}, batching={}, log_freq=1.0,
                              io={}, auto_update={}, engine_options={})
                s.add(ep)
            engine_changed, ep.engine = ep.engine != req.engine, req.engine
            if req.preprocess is not None:
                ep.preprocess = req.preprocess.model_dump()
            ep.preprocess = formats.handler_preprocess(req.engine, req.preprocess, ep.preprocess)
            if req.batching is not None or not ep.batching or engine_changed:  # another engine: its own default
                # ClearML Serving's default: no batching when tensors are declared (sizes are whole shapes)
                ep.batching = (req.batching or schemas.Batching(max_batch_size=0 if req.io else 32)).model_dump()
            if model is not None:
                ep.batching = formats.with_format(ep.batching, model.framework, req.aux_config)
                formats.deployable_format(req.engine, model.framework, f"{model.name}:{model.version}",
                                          ep.batching.get("triton_config"), self.external_triton)
            if req.io is not None:
                ep.io = declared_io(req.io, ep.batching, model)
            elif engine_changed:
                ep.io = {}
            if model is not None:
                formats.tensors_known(ep.engine, model, ep.io)
            if req.engine_options is not None or engine_changed:
                ep.engine_options = req.engine_options or {}
            if req.engine in schemas.LLM_ENGINES:
                if model is not None:
                    ep.engine_options = join_base_engine(s, ep.name, model, ep.engine_options or {})
                _check_llm(model, ep.engine_options)
            if req.max_versions is not None:
                ep.auto_update = {"model": model.name, "max_versions": req.max_versions, "weights": None}
                route_newest(s, ep, self.external_triton)
            elif model is not None:
                ep.auto_update = {}
                route(ep, model, req.canary)
            else:
                ep.auto_update = {}
                ep.targets.clear()
            s.flush()

        self._write(put, f"deploying endpoint {req.endpoint}")
        return self.get_endpoint(req.endpoint)

    def _implied_engine(self, req: schemas.EndpointDeploy) -> str:
        """No --engine: the endpoint's own for a shadow, else what the model's format implies
        (registry/formats.py: a TorchServe archive runs its handler), else triton."""
        with self.sessions() as s:
            if req.shadow is not None:
                ep = s.scalar(select(Endpoint).where(Endpoint.name == req.endpoint))
                return ep.engine if ep is not None else "triton"
            model = _model(s, req.model, req.version) if req.model else None
            return formats.implied_engine(model.framework if model is not None else None)

    def _check_deployable(self, req: schemas.EndpointDeploy, model: ModelVersion | None) -> None:
        if model is None:
            if req.engine not in schemas.MODEL_LESS_ENGINES:
                raise BadRequest(f"engine {req.engine} needs a model (--model NAME[:VERSION]); only "
                                    f"{' and '.join(schemas.MODEL_LESS_ENGINES)} endpoints may have none")
            if req.canary is not None or req.max_versions is not None:
                raise BadRequest("a canary or auto-update needs a model")
            if req.preprocess is None or req.preprocess.kind != "user":
                raise BadRequest("an endpoint without a model runs preprocess.py: give --preprocess")
        pre = req.preprocess
        if pre is not None and pre.artifact and not self.store.exists(pre.artifact):
            raise NotFound(f"preprocess artifact {pre.artifact} was not uploaded")

    def set_shadow(self, req: schemas.EndpointDeploy) -> Endpoint:
        """Add or replace the endpoint's shadow target: its weight is the percent of requests copied to it.
        It runs with the endpoint's engine and preprocessing; nothing else of the endpoint changes."""
        if req.model is None or req.canary is not None or req.max_versions is not None:
            raise BadRequest("a shadow needs a model (--model NAME[:VERSION]) and no --canary or --max-versions")

        def put(s: Session) -> None:
            ep = self._endpoint(s, req.endpoint)
            model = _model(s, req.model, req.version)
            formats.deployable_format(ep.engine, model.framework, f"{model.name}:{model.version}",
                                      (ep.batching or {}).get("triton_config"), self.external_triton)
            if ep.engine in schemas.LLM_ENGINES:
                _check_llm(model, ep.engine_options)
            formats.tensors_known(ep.engine, model, ep.io)
            if ep.io and ep.engine in ("triton", "onnxruntime"):
                try:
                    io_spec.check_against(ep.io, model.signature or {}, f"{model.name}:{model.version}")
                except io_spec.IOMismatch as exc:
                    raise Unprocessable(str(exc)) from None
            live = [t for t in ep.targets if t.role != "shadow"]
            if not live:
                raise Conflict(f"endpoint {ep.name} has no live version to shadow")
            if any(t.model_id == model.id for t in live):
                raise Conflict(f"{model.name}:{model.version} already answers on {ep.name}; shadow another version")
            for t in [t for t in ep.targets if t.role == "shadow"]:
                ep.targets.remove(t)
            s.flush()  # delete before insert: (endpoint, model) is unique
            ep.targets.append(EndpointTarget(model=model, weight=float(req.shadow), role="shadow"))
            s.flush()

        self._write(put, f"shadowing endpoint {req.endpoint}")
        return self.get_endpoint(req.endpoint)

    def remove_shadow(self, name: str) -> Endpoint:
        def drop(s: Session) -> None:
            ep = self._endpoint(s, name)
            shadows = [t for t in ep.targets if t.role == "shadow"]
            if not shadows:
                raise NotFound(f"endpoint {name} has no shadow")
            for t in shadows:
                ep.targets.remove(t)
            s.flush()

        self._write(drop, f"removing the shadow of endpoint {name}")
        return self.get_endpoint(name)

    def follow_new_version(self, model_name: str) -> dict[str, list[dict]]:
        """Auto-update endpoints of this model move to its newest versions (ClearML's ``model auto-update``);
        per endpoint, the versions it skipped because its engine cannot run them (registry/routes.py)."""
        with self.sessions() as s:
            if not any((ep.auto_update or {}).get("model") == model_name for ep in s.scalars(select(Endpoint))):
                return {}  # nothing follows this model: no write, no new revision

        def follow(s: Session) -> dict[str, list[dict]]:
            changed = [ep for ep in s.scalars(select(Endpoint)) if (ep.auto_update or {}).get("model") == model_name]
            skipped = {ep.name: route_newest(s, ep, self.external_triton) for ep in changed}
            s.flush()
            return skipped

        return self._write(follow, f"following the newest versions of {model_name}")

    def set_newest_weights(self, name: str, req: schemas.NewestWeights) -> Endpoint:
        """Weights for the newest versions, oldest first; kept by auto-update endpoints for later versions."""
        def weigh(s: Session) -> None:
            ep = self._endpoint(s, name)
            if ep.auto_update:
                ep.auto_update = {**ep.auto_update, "weights": req.weights}
                route_newest(s, ep, self.external_triton)
            else:
                targets = sorted(ep.targets, key=lambda t: t.model.version)
                if len(req.weights) > len(targets):
                    raise Conflict(f"endpoint {name} serves {len(targets)} version(s); got {len(req.weights)} weights")
                for t in targets:
                    t.weight = 0.0
                for t, w in zip(targets[-len(req.weights):], req.weights):
                    t.weight = w
            s.flush()

        self._write(weigh, f"setting the newest weights of endpoint {name}")
        return self.get_endpoint(name)

    def set_weights(self, name: str, req: schemas.CanaryWeights) -> Endpoint:
        def weigh(s: Session) -> None:
            ep = self._endpoint(s, name)
            by_version = {t.model.version: t for t in ep.targets if t.role != "shadow"}  # shadows keep their share
            unknown = sorted(set(req.weights) - set(by_version))
            if unknown:
                raise NotFound(f"endpoint {name} has no target version(s) {unknown}; it routes {sorted(by_version)}")
            for version, target in by_version.items():
                target.weight = float(req.weights.get(version, 0.0))
            s.flush()

        self._write(weigh, f"setting the weights of endpoint {name}")
        return self.get_endpoint(name)

    def promote(self, name: str) -> Endpoint:
        """The canary becomes the only (stable) target."""
        return self._keep(name, "canary")

    def rollback(self, name: str) -> Endpoint:
        """The stable version takes all traffic again; canaries are dropped."""
        return self._keep(name, "stable")

    def _keep(self, name: str, role: str) -> Endpoint:
        def keep_only(s: Session) -> None:
            ep = self._endpoint(s, name)
            keep = [t for t in ep.targets if t.role == role]  # a shadow is dropped with the rest (docs/rollouts.md)
            if not keep or len([t for t in ep.targets if t.role != "shadow"]) < 2:
                raise Conflict(f"endpoint {name} has no canary in progress")
            for t in list(ep.targets):
                if t is not keep[-1]:
                    ep.targets.remove(t)
            keep[-1].role, keep[-1].weight = "stable", 100.0
            s.flush()

        self._write(keep_only, f"{'promoting' if role == 'canary' else 'rolling back'} endpoint {name}")
        return self.get_endpoint(name)

    def list_endpoints(self) -> list[Endpoint]:
        with self.sessions() as s:
            q = select(Endpoint).order_by(Endpoint.name).options(
                selectinload(Endpoint.targets).selectinload(EndpointTarget.model), selectinload(Endpoint.metrics))
            return list(s.scalars(q))

    def get_endpoint(self, name: str) -> Endpoint:
        with self.sessions() as s:
            return self._endpoint(s, name)

    def remove_endpoint(self, name: str) -> None:
        def remove(s: Session) -> None:
            s.delete(self._endpoint(s, name))
            s.flush()

        self._write(remove, f"removing endpoint {name}")

    def set_log_freq(self, name: str, freq: float) -> None:
        def set_freq(s: Session) -> None:
            self._endpoint(s, name).log_freq = freq
            s.flush()

        self._write(set_freq, f"setting the log frequency of endpoint {name}")

    def set_prediction_log(self, name: str, settings: dict | None) -> None:
        def set_log(s: Session) -> None:
            self._endpoint(s, name).prediction_log = settings
            s.flush()

        self._write(set_log, f"setting the prediction log of endpoint {name}")

    # --- metric definitions -----------------------------------------------------------
    def add_metric(self, endpoint: str, req: schemas.MetricCreate) -> None:
        def add(s: Session) -> None:
            ep = self._endpoint(s, endpoint)
            spec = {"buckets": req.buckets} if req.kind == "scalar" else {"values": req.values} if req.kind == "enum" else {}
            existing = next((m for m in ep.metrics if m.name == req.name), None)
            if existing is None:
                ep.metrics.append(MetricDefinition(name=req.name, kind=req.kind, spec=spec))
            else:
                existing.kind, existing.spec = req.kind, spec
            s.flush()

        self._write(add, f"declaring variable {req.name} of endpoint {endpoint}")

    def remove_metric(self, endpoint: str, name: str) -> None:
        def remove(s: Session) -> None:
            ep = self._endpoint(s, endpoint)
            metric = next((m for m in ep.metrics if m.name == name), None)
            if metric is None:
                raise NotFound(f"endpoint {endpoint} has no metric {name}")
            ep.metrics.remove(metric)
            s.flush()

        self._write(remove, f"removing variable {name} of endpoint {endpoint}")

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


def _llm_signature(path) -> dict:
    """A Hugging Face folder's facts (serving/llm/checks.py), read once at upload."""
    from serving.llm.checks import llm_signature
    from serving.llm.folder import FolderError, read_archive

    try:
        return llm_signature(read_archive(path))
    except FolderError as exc:
        raise Unprocessable(str(exc)) from None


def _check_llm(model: ModelVersion | None, options: dict, why: str = "") -> None:
    """422 naming everything that keeps vLLM from serving this version with these options."""
    from serving.llm.checks import servable_problems

    if model is None:
        return  # refused by _check_deployable: vllm is not a model-less engine
    label = f"{model.name}:{model.version}" if model.version else f"the new version of {model.name}"
    problems = servable_problems(label, model.signature or {}, options or {})
    if model.framework == "hf-lora" and model.signature:
        from serving.llm.checks import adapter_problems

        problems += adapter_problems(label, model.signature, options or {})
    if problems:
        raise Unprocessable(f"engine vllm cannot serve it{why}: " + "; ".join(problems))


def _adapters_on(s: Session, bases: list[ModelVersion]) -> set[str]:
    """Endpoints serving a LoRA adapter of one of these versions (the base's engine runs it)."""
    refs = {(m.name, m.version) for m in bases}
    found = set()
    q = (select(Endpoint.name, ModelVersion.signature).select_from(Endpoint)
         .join(EndpointTarget, EndpointTarget.endpoint_id == Endpoint.id)
         .join(ModelVersion, EndpointTarget.model_id == ModelVersion.id).where(ModelVersion.framework == "hf-lora"))
    for ep_name, sig in s.execute(q):
        base = ((sig or {}).get("lora") or {}).get("base") or {}
        if (base.get("name"), base.get("version")) in refs:
            found.add(ep_name)
    return found


def _model(s: Session, name: str, version: int | None) -> ModelVersion:
    q = select(ModelVersion).where(ModelVersion.name == name)
    q = q.where(ModelVersion.version == version) if version else q.order_by(ModelVersion.version.desc())
    model = s.scalars(q).first()
    if model is None:
        raise NotFound(f"model {name}" + (f":{version}" if version else "") + " not found")
    return model

"""What TorchServe's management calls change in the registry (the mapping: registry/torchserve_models.py).

* Register: the archive becomes a registry version of the model (an identical archive registered
  before is that version again), then either a new endpoint of engine ``torchserve`` routing it 100%,
  or, when the model exists, one more target of its endpoint: a canary routed 0%. That is TorchServe's
  behaviour (a new version is loaded, and the default stays until ``set-default``) in the platform's
  terms: the workers load every target before routing to the new set (readiness gating), answer the
  new version when asked by version (``/predictions/NAME/2.0``), and give it no share of the rest.
* Set default: that version becomes the stable target at 100%, every other version a canary at 0%.
* Unregister: the target goes (its registry version stays, as TorchServe's model store keeps the
  .mar); the last version takes the endpoint with it; the default cannot go while others remain.
* Scale: ``min_worker`` is the endpoint's ``workers`` engine option, shared by its versions.

Changes are serialized in this process: TorchServe's calls decide on what they read (is there such a
model, which versions it has) and a registration of one model must not race another's.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from registry import formats, schemas
from registry.errors import NotFound
from registry.orm import Endpoint, EndpointTarget, ModelVersion
from registry.service import Registry
from registry.torchserve_models import (
    ENGINE, URL_KEY, ManagementError, conflict, default_target, find_target, is_torchserve, live_targets,
    model_not_found, version_label,
)
from serving.torchserve.archive import ArchiveInfo


@dataclass(frozen=True)
class Registration:
    """What a registration did, so a synchronous one whose workers fail can be undone."""

    name: str
    label: str
    version: int
    created: bool  # the endpoint is new: undoing removes it


class TorchServeModels:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._lock = threading.Lock()

    # --- reads ------------------------------------------------------------------
    def endpoint(self, name: str) -> Endpoint:
        """The endpoint of a TorchServe model; any other name is TorchServe's 404."""
        try:
            ep = self.registry.get_endpoint(name)
        except NotFound:
            raise model_not_found(name) from None
        if not is_torchserve(ep) or not live_targets(ep):
            raise model_not_found(name)
        return ep

    def endpoints(self) -> list[Endpoint]:
        return self.registry.list_endpoints()

    # --- changes ----------------------------------------------------------------
    def register(self, name: str, sha256: str, url: str, info: ArchiveInfo, options: dict[str, int]) -> Registration:
        with self._lock:
            current = self._current(name)
            if current is not None:
                self._check_new(current, info.model_version, sha256)
            model = self._version_of(name, sha256, url)
            label = version_label(model)
            if current is None:
                self.registry.deploy(schemas.EndpointDeploy(endpoint=name, model=name, version=model.version,
                                                            engine=ENGINE, engine_options=options or None))
                return Registration(name, label, model.version, created=True)
            self.registry._write(lambda s: _add_target(s, name, model.id, info.model_version, options),
                                 f"adding a version to {name}")
            return Registration(name, label, model.version, created=False)

    def undo(self, done: Registration) -> None:
        """Take back a registration whose workers could not load it (TorchServe unregisters it too)."""
        with self._lock:
            if done.created:
                self.registry.remove_endpoint(done.name)
                return
            self.registry._write(lambda s: _drop_version(s, done.name, str(done.version), force=True),
                                 f"removing version {done.label} of {done.name}")

    def set_default(self, name: str, version: str) -> str:
        with self._lock:
            return self.registry._write(lambda s: _set_default(s, name, version),
                                        f"setting the default version of {name}")

    def unregister(self, name: str, version: str | None) -> None:
        with self._lock:
            self.registry._write(lambda s: _drop_version(s, name, version), f"unregistering {name}")

    def set_options(self, name: str, version: str | None, options: dict[str, int]) -> dict[str, Any]:
        """The endpoint's engine options updated; returns those it had (to put back)."""
        with self._lock:
            return self.registry._write(lambda s: _set_options(s, name, version, options),
                                        f"scaling the workers of {name}")

    def restore_options(self, name: str, options: dict[str, Any]) -> None:
        with self._lock:
            self.registry._write(lambda s: _set_options(s, name, None, options, replace=True),
                                 f"restoring the workers of {name}")

    # --- helpers ----------------------------------------------------------------
    def _current(self, name: str) -> Endpoint | None:
        try:
            ep = self.registry.get_endpoint(name)
        except NotFound:
            return None
        if not is_torchserve(ep):
            raise conflict(f"endpoint {name} exists and serves engine {ep.engine}, not a TorchServe archive; "
                           "register the archive under another model_name")
        if ep.auto_update:
            raise conflict(f"endpoint {name} follows the newest versions of model {ep.auto_update.get('model')} "
                           "(auto-update); its versions are not registered one by one")
        return ep

    @staticmethod
    def _check_new(ep: Endpoint, label: str, sha256: str) -> None:
        for t in live_targets(ep):
            if (label and version_label(t.model) == label) or t.model.sha256 == sha256:
                raise conflict(f"Model version {version_label(t.model)} is already registered for model {ep.name}")

    def _version_of(self, name: str, sha256: str, url: str) -> ModelVersion:
        """The registry version of this archive: the one registered before with the same bytes, else a new one
        (auto-update endpoints following the model then follow it, as after ``POST /models``)."""
        for model in reversed(self.registry.list_models(name)):
            if model.sha256 == sha256 and model.framework == ENGINE:
                return model
        # the declared framework is the default: an archive is recognised as one whatever it is called
        model = self.registry.add_model(schemas.ModelCreate(name=name, artifact=sha256, metadata={URL_KEY: url}))
        self.registry.follow_new_version(name)
        return model


def _torchserve_endpoint(s: Session, name: str) -> Endpoint:
    ep = s.scalar(select(Endpoint).where(Endpoint.name == name))
    if not is_torchserve(ep) or not live_targets(ep):
        raise model_not_found(name)
    return ep


def _add_target(s: Session, name: str, model_id: int, label: str, options: dict[str, int]) -> None:
    ep = _torchserve_endpoint(s, name)
    model = s.get(ModelVersion, model_id)
    TorchServeModels._check_new(ep, label, model.sha256)  # again: what was read before may have changed
    formats.deployable_format(ENGINE, model.framework, f"{model.name}:{model.version}", None, False)
    for shadow in [t for t in ep.targets if t.model_id == model.id]:  # it shadowed: now it is a version
        ep.targets.remove(shadow)
    s.flush()  # delete before insert: (endpoint, model) is unique
    ep.targets.append(EndpointTarget(model=model, weight=0.0, role="canary"))
    if options:
        ep.engine_options = {**(ep.engine_options or {}), **options}
    s.flush()


def _set_default(s: Session, name: str, version: str) -> str:
    ep = _torchserve_endpoint(s, name)
    chosen = find_target(ep, version)
    for t in live_targets(ep):
        t.role, t.weight = ("stable", 100.0) if t is chosen else ("canary", 0.0)
    s.flush()
    return version_label(chosen.model)


def _drop_version(s: Session, name: str, version: str | None, force: bool = False) -> None:
    """TorchServe's unregister: the default version goes only when it is the last one (``force``: undoing
    a registration, whatever it routes)."""
    ep = _torchserve_endpoint(s, name)
    target, live = find_target(ep, version), live_targets(ep)
    default = default_target(ep)
    if len(live) == 1:
        s.delete(ep)
        s.flush()
        return
    if target is default and not force:
        raise ManagementError(403, "InvalidModelVersionException", f"Cannot remove default version for model {name}")
    if default is not None and default is not target:
        default.weight += target.weight  # a share it had (a canary set elsewhere) goes back to the default
    ep.targets.remove(target)
    s.flush()


def _set_options(s: Session, name: str, version: str | None, options: dict[str, Any],
                 replace: bool = False) -> dict[str, Any]:
    ep = _torchserve_endpoint(s, name)
    if version is not None:
        find_target(ep, version)  # a version that is not there is TorchServe's 404, though options are shared
    before = dict(ep.engine_options or {})
    ep.engine_options = dict(options) if replace else {**before, **options}
    s.flush()
    return before

"""Keep an external Triton model repository in step with the config snapshot.

A standalone Triton (its own container, GPU box, ...) cannot follow our SSE
stream, so the control plane writes its model repository instead:
``<repo>/<triton_name>/config.pbtxt`` plus ``1/`` holding the model in Triton's default
layout for its format (``model.onnx``, ``model.plan``, ``model.pt``, ``model.savedmodel/``,
``model.xml`` + ``model.bin``, ``model.py``: serving/triton/model_formats.py), and, when
Triton runs with ``--model-control-mode=explicit``, tells it to load/unload by HTTP. A model
uploaded with its own config.pbtxt keeps it (renamed, with the endpoint's --aux-config fields
merged in); one without gets a config.pbtxt generated from its signature, or from the endpoint's
declared inputs and outputs (ClearML's ``--input-name/--input-type/--input-size``).

config.pbtxt is generated from Triton's own protobuf schema (bundled in
tritonclient) rather than by string formatting, so a typo can never produce a
file Triton refuses at load time; ``validate_config_pbtxt`` parses strictly
against the same schema.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

from serving.triton.aux_config import is_repeated
from serving.triton.model_folder import ConfigError, is_archive, parse_config, unpack
from serving.triton.model_formats import FORMATS, TritonFormat, target_format
from serving.triton.naming import TRITON_VERSION, triton_model_name
from serving.triton.pod_readiness import Latch, LoadState, could_not_try
from serving.triton.shapes import batch_size, config_dims

log = logging.getLogger(__name__)

MARKER = ".serving-managed"  # only directories carrying it are ever removed
OWN_CONFIG = ".config.pbtxt.uploaded"  # the config.pbtxt a model was uploaded with (Triton reads no dot-file)
RETRY_PERIOD_S = 5.0  # how often failed loads are retried and Triton is checked for lost models
DEFAULT_BATCHING: dict[str, Any] = {"max_batch_size": 32, "max_queue_delay_us": 2000,
                                    "preferred_batch_sizes": [], "instances": 1}


@dataclass(frozen=True)
class TritonTarget:
    """One model Triton must serve, with the batching of the endpoint that uses it."""

    name: str
    artifact: str
    signature: dict[str, Any] | None
    batching: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_BATCHING))
    framework: str = "onnx"
    io: dict[str, Any] = field(default_factory=dict)  # the endpoint's declared inputs/outputs

    @property
    def format(self) -> TritonFormat:
        return target_format(self.framework, self.batching.get("triton_config")) or FORMATS["onnx"]


def triton_targets(snapshot: dict[str, Any]) -> dict[str, TritonTarget]:
    """Targets of every ``engine == "triton"`` endpoint, by Triton model name.

    A model version shared by two endpoints is one Triton model; the first
    endpoint (by name, so the choice is stable) decides its batching.
    """
    found: dict[str, TritonTarget] = {}
    endpoints = snapshot.get("endpoints") or {}
    for ep_name in sorted(endpoints):
        ep = endpoints[ep_name]
        if ep.get("engine") != "triton":
            continue
        batching = {**DEFAULT_BATCHING, **(ep.get("batching") or {})}
        for t in ep.get("targets") or []:
            name = t.get("triton_name") or triton_model_name(t["model"], t["version"])
            if name not in found:
                found[name] = TritonTarget(name, t["artifact"], t.get("signature"), batching,
                                           t.get("framework") or "onnx", ep.get("io") or {})
    return found


def triton_dtype(dtype: str) -> int:
    """Signature dtype (KServe v2 name, e.g. ``FP32``) -> Triton config enum."""
    key = "TYPE_STRING" if dtype.upper() == "BYTES" else f"TYPE_{dtype.upper()}"
    try:
        return mc.DataType.Value(key)
    except ValueError:
        raise ConfigError(f"unsupported dtype {dtype!r}") from None


def _add_tensors(repeated: Any, specs: list[dict[str, Any]], batched: bool) -> None:
    for spec in specs:
        dims, reshape = config_dims(list(spec["shape"]), batched)  # Triton adds the batch dimension itself
        tensor = repeated.add(name=spec["name"], data_type=triton_dtype(spec["dtype"]), dims=dims)
        if reshape is not None:
            tensor.reshape.shape.extend(reshape)


def _tensor_specs(target: TritonTarget) -> dict[str, list[dict[str, Any]]]:
    """The signature's tensors, else the endpoint's declared ones when they are complete (ClearML
    writes config.pbtxt's inputs from --input-name/--input-type/--input-size); else none, and Triton
    auto-completes them from the model where its backend can."""
    sig = target.signature or {}
    if sig.get("inputs") or sig.get("outputs"):  # with the max_batch_size a model's own declaration fixes
        return {**{side: list(sig.get(side) or []) for side in ("inputs", "outputs")},
                **({"max_batch_size": sig["max_batch_size"]} if "max_batch_size" in sig else {})}
    io = target.io or {}
    complete = all(t.get("dtype") and t.get("shape") is not None for side in ("inputs", "outputs")
                   for t in io.get(side) or [])
    return {side: list(io.get(side) or []) for side in ("inputs", "outputs")} if complete else {}


def model_config(target: TritonTarget) -> mc.ModelConfig:
    """The ModelConfig message for a target of Triton's default layout, behind its dynamic batcher."""
    b, fmt = target.batching, target.format
    specs = _tensor_specs(target)
    max_batch = batch_size(b, specs or target.signature)
    cfg = mc.ModelConfig(name=target.name, platform=fmt.platform, backend=fmt.backend, max_batch_size=max_batch)
    if max_batch > 0:
        preferred = sorted({int(s) for s in b.get("preferred_batch_sizes") or [] if 0 < int(s) <= max_batch})
        cfg.dynamic_batching.max_queue_delay_microseconds = int(b.get("max_queue_delay_us") or 0)
        cfg.dynamic_batching.preferred_batch_size.extend(preferred)
    cfg.instance_group.add(count=max(1, int(b.get("instances") or 1)), kind=mc.ModelInstanceGroup.KIND_AUTO)
    _add_tensors(cfg.input, specs.get("inputs", []), max_batch > 0)
    _add_tensors(cfg.output, specs.get("outputs", []), max_batch > 0)
    _merge_extra(cfg, b)
    return cfg


def own_config(target: TritonTarget, text: str) -> mc.ModelConfig:
    """A model's own config.pbtxt under its Triton name, the endpoint's --aux-config fields merged in."""
    cfg = parse_config(text)
    cfg.name = target.name
    _merge_extra(cfg, target.batching)
    return cfg


def _merge_extra(cfg: mc.ModelConfig, batching: dict[str, Any]) -> None:
    if batching.get("triton_config"):  # ClearML's other --aux-config keys (serving/triton/aux_config.py)
        _merge(cfg, json_format.ParseDict(batching["triton_config"], mc.ModelConfig()))


def _merge(cfg: Any, extra: Any) -> None:
    """Fields set in ``extra`` win: nested messages merge field by field, a one-element repeated message
    (``instance_group.kind=KIND_GPU``) merges into the one written here, other repeated fields are replaced."""
    for fd, value in extra.ListFields():
        mine = getattr(cfg, fd.name)
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            mine.MergeFrom(value)
        elif fd.message_type is not None and not is_repeated(fd):
            _merge(mine, value)
        elif fd.message_type is not None and len(mine) == 1 and len(value) == 1:
            _merge(mine[0], value[0])
        elif is_repeated(fd):
            cfg.ClearField(fd.name)
            getattr(cfg, fd.name).extend(value)
        else:
            setattr(cfg, fd.name, value)


def config_pbtxt(target: TritonTarget, own: str | None = None, aux: bool = True) -> str:
    """``aux``: merge the endpoint's other --aux-config fields (an external Triton's; not the embedded one's)."""
    if not aux:
        named = {k: v for k, v in (target.batching.get("triton_config") or {}).items() if k in ("platform", "backend")}
        target = replace(target, batching={**target.batching, "triton_config": named})
    return text_format.MessageToString(own_config(target, own) if own is not None else model_config(target))


def validate_config_pbtxt(text: str) -> mc.ModelConfig:
    """Parse strictly (unknown fields and bad enums fail) and check what Triton checks at load
    (model_folder.parse_config), and that what we write names its model and backend."""
    cfg = parse_config(text)
    if not cfg.name or not (cfg.backend or cfg.platform):
        raise ConfigError("config.pbtxt needs a name and a backend or platform")
    return cfg


def _write_text(path: Path, text: str) -> bool:
    """Atomic write; returns whether the content changed (so unchanged models are not reloaded)."""
    if path.exists() and path.read_text() == text:
        return False
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; Triton may run as another user
    os.replace(tmp, path)
    return True


def _place_file(src: Path, dest: Path) -> None:
    """Hardlink (no copy of a large model) when on one filesystem, copy otherwise; atomic."""
    tmp = dest.with_name(f".tmp-{dest.name}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dest)


def write_model(repo_dir: Path, target: TritonTarget, artifact_path: Path, aux: bool = True) -> bool:
    """Write one model directory in its format's layout; returns whether anything in it changed."""
    model_dir = repo_dir / target.name
    version_dir = model_dir / str(TRITON_VERSION)
    marker = json.dumps({"artifact": target.artifact})
    own = model_dir / OWN_CONFIG
    placed = not (model_dir / MARKER).exists() or (model_dir / MARKER).read_text() != marker \
        or not version_dir.exists()
    if placed:  # a new artifact: its files only, nothing of the old one's
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir(parents=True)
        if is_archive(artifact_path):
            if unpack(artifact_path, model_dir) is not None:  # the upload's own config, kept beside ours
                os.replace(model_dir / "config.pbtxt", own)
        else:
            version_dir.mkdir()
            _place_file(artifact_path, version_dir / target.format.filename)
        _write_text(model_dir / MARKER, marker)
    text = config_pbtxt(target, own.read_text() if own.exists() else None, aux)
    validate_config_pbtxt(text)
    return _write_text(model_dir / "config.pbtxt", text) or placed


def managed_models(repo_dir: Path) -> set[str]:
    """Model directories this writer owns (others in a shared repository are left alone)."""
    if not repo_dir.exists():
        return set()
    return {p.name for p in repo_dir.iterdir() if (p / MARKER).exists()}


class RepositorySync:
    """Makes ``repo_dir`` (and, with ``control_url``, the Triton serving it) match each snapshot."""

    def __init__(self, repo_dir: Path, artifact_path: Callable[[str], Path], control_url: str | None,
                 headers: dict[str, str] | None = None, retry_period_s: float = RETRY_PERIOD_S) -> None:
        self.repo_dir = Path(repo_dir)
        self.retry_period_s = retry_period_s
        self.artifact_path = artifact_path
        self.control_url = control_url
        self.headers = headers
        self._synced_once = False
        self._pending: set[str] = set()  # loads that failed (Triton down): retried until they succeed
        self._wanted: set[str] = set()
        self._loaded: set[str] = set()  # loads Triton accepted (and has not lost since)
        self._refused: dict[str, str] = {}  # name -> why Triton, or the model's files, refused it
        self._unwritten: set[str] = set()  # entries not written yet (artifact not fetched): retried
        self._snapshot: dict[str, Any] | None = None
        self.revision = -1
        self.latch = Latch()
        self._apply_lock = threading.RLock()  # the config thread and the retry thread both apply
        self._lock = threading.Lock()
        self._retry = threading.Thread(target=self._retry_loop, name="triton-load-retry", daemon=True)
        self._retry.start()

    def apply(self, snapshot: dict[str, Any]) -> None:
        """Write new/changed models, then load them, then unload and delete removed ones."""
        with self._apply_lock:
            self._apply(snapshot)

    def _apply(self, snapshot: dict[str, Any]) -> None:
        self.repo_dir.mkdir(parents=True, exist_ok=True)
        self._snapshot = snapshot
        self.revision = int(snapshot.get("revision", -1))
        wanted = triton_targets(snapshot)
        stale = managed_models(self.repo_dir) - set(wanted)
        changed, unwritten = [], set()
        for name, target in wanted.items():
            try:
                if write_model(self.repo_dir, target, self.artifact_path(target.artifact)):
                    changed.append(name)
            except Exception as exc:  # one model's files must not stop the others
                log.error("cannot write Triton model %s: %s", name, exc)
                if could_not_try(exc):
                    unwritten.add(name)  # the artifact could not be fetched: written again later
                else:
                    self._refused[name] = str(exc)
        # On the first snapshot Triton's state is unknown: (re)load everything we want.
        to_load = set(wanted) if not self._synced_once else set(changed)
        with self._lock:
            self._wanted = set(wanted)
            self._unwritten = unwritten
            self._pending &= set(wanted) - unwritten  # no files yet: nothing to load until they are written
            to_load -= unwritten
            self._loaded -= set(changed)
            self._control(sorted(to_load | self._pending), sorted(stale))
        for name in stale:
            shutil.rmtree(self.repo_dir / name, ignore_errors=True)
        self._synced_once = True

    def readiness(self) -> dict[str, Any]:
        """GET /ready of a Triton pod whose models this loads (serving/triton/pod_readiness.py)."""
        with self._lock:
            return self.latch.report(LoadState(self._synced_once, set(self._wanted), set(self._loaded),
                                               dict(self._refused)))

    def report(self) -> dict[str, Any]:
        """The readiness report to the control plane (serving/readiness_report.py): what Triton refused."""
        with self._lock:
            return {"revision": self.revision,
                    "failures": {n: why for n, why in self._refused.items() if n in self._wanted}}

    def _retry_loop(self) -> None:
        while True:
            time.sleep(self.retry_period_s)
            if self._unwritten and self._snapshot is not None:
                self.apply(self._snapshot)
            with self._lock:
                lost = self._lost()
                if lost:
                    self.latch.reset()  # tritonserver restarted: the pod waits for its models again
                    log.warning("Triton lost %s (restarted, or unloaded behind our back); loading again",
                                ", ".join(lost))
                    self._pending |= set(lost)
                if self._pending:
                    self._control(sorted(self._pending), [])

    def _lost(self) -> list[str]:
        """Wanted models Triton's repository index does not show READY: after a Triton restart in
        explicit model-control mode nothing is loaded, and a model can be unloaded through Triton's
        own API. Nothing when Triton cannot be asked (down: the loads are retried once it is back)."""
        if not self.control_url or not self._wanted:
            return []
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(_strip_scheme(self.control_url), network_timeout=10.0)
        try:
            index = client.get_model_repository_index(headers=self.headers)
        except Exception as exc:
            log.debug("cannot read Triton's repository index: %s", exc)
            return []
        finally:
            client.close()
        ready = {m.get("name") for m in index if isinstance(m, dict) and m.get("state") == "READY"}
        self._loaded &= ready
        return sorted(self._wanted - ready - self._pending - set(self._refused))

    def _control(self, load: list[str], unload: list[str]) -> None:
        if not self.control_url or not (load or unload):
            return
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(_strip_scheme(self.control_url), network_timeout=120.0)
        try:
            for name, action in [*((n, client.load_model) for n in load),
                                 *((n, client.unload_model) for n in unload)]:
                try:
                    action(name, headers=self.headers)
                    log.info("triton %s %s", action.__name__, name)
                    self._pending.discard(name)
                    self._refused.pop(name, None)
                    (self._loaded.add if action == client.load_model else self._loaded.discard)(name)
                except Exception as exc:  # Triton down or model broken: log, retry loads later
                    log.error("triton %s %s failed: %s", action.__name__, name, exc)
                    if action == client.load_model:
                        self._pending.add(name)
                        if not could_not_try(exc):
                            self._refused[name] = str(exc)
        finally:
            client.close()


def _strip_scheme(url: str) -> str:
    """tritonclient wants host:port; the settings carry a URL."""
    return url.split("://", 1)[-1].rstrip("/")

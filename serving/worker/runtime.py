"""The worker's view of a config snapshot: immutable, swapped whole on each revision.

Requests read ``ConfigSync.current`` once and use that object to the end, so a
revision applied mid-request never mixes two configs (the atomic apply the
control plane's contract asks for).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

from preprocess.base import Processor
from serving.prediction_log.policy import LogPolicy
from serving.triton.model_formats import target_format
from serving.triton.shapes import batch_size, padded


@dataclass(frozen=True)
class Target:
    """One model version behind an endpoint."""

    model: str
    version: int
    weight: float
    triton_name: str
    artifact: str
    inputs: tuple[dict, ...]
    outputs: tuple[dict, ...]
    max_batch: int = 0  # the Triton max_batch_size it is served with: 0 means no batching (serving/triton/shapes.py)
    role: str = "stable"  # stable | canary | shadow (weight: percent of requests copied to it, never answered)
    framework: str = ""  # the model's format (the snapshot's); for an upload of unknown format, the Triton
    # format its endpoint's --aux-config platform/backend named (serving/triton/model_formats.py)
    # LLM endpoints (engine vllm): the endpoint's engine options and the signature's "llm" entry
    # (max_model_len, architectures, chat_template); not part of the target's identity
    engine_options: Mapping[str, Any] = field(default_factory=dict, compare=False)
    llm: Mapping[str, Any] = field(default_factory=dict, compare=False)
    lora: Mapping[str, Any] = field(default_factory=dict, compare=False)  # a LoRA adapter's: rank, base, ...
    archive_version: str = field(default="", compare=False)  # a TorchServe archive's own --version (/predictions)

    @classmethod
    def from_snapshot(cls, t: dict[str, Any], batching: dict[str, Any] | None = None,
                      engine_options: dict[str, Any] | None = None) -> "Target":
        sig = t.get("signature") or {}
        return cls(model=t["model"], version=int(t["version"]), weight=float(t.get("weight", 0)),
                   triton_name=t.get("triton_name") or "", artifact=t.get("artifact", ""),
                   inputs=tuple(sig.get("inputs") or ()), outputs=tuple(sig.get("outputs") or ()),
                   max_batch=batch_size(batching, sig), role=str(t.get("role") or "stable"),
                   framework=_format(t.get("framework"), batching),
                   engine_options=dict(engine_options or {}), llm=dict(sig.get("llm") or {}),
                   lora=dict(sig.get("lora") or {}),
                   archive_version=str((sig.get("torchserve") or {}).get("model_version") or ""))

    @property
    def shadow(self) -> bool:
        return self.role == "shadow"

    @property
    def tokenizer_artifact(self) -> str:
        """The folder whose tokenizer counts this version's prompts: a LoRA adapter's base's."""
        base = self.lora.get("base")
        return str(base.get("artifact") or "") if isinstance(base, Mapping) else self.artifact

    @cached_property
    def padded(self) -> dict[str, int]:
        """Tensors Triton's API carries with a trailing 1 (serving/triton/shapes.py), by model rank."""
        return padded((*self.inputs, *self.outputs), self.max_batch > 0)

    @property
    def output_names(self) -> list[str]:
        return [o["name"] for o in self.outputs]

    @classmethod
    def model_less(cls, endpoint: str) -> "Target":
        """A custom endpoint without a model still routes to one target; its statistics say version 0."""
        return cls(model=endpoint, version=0, weight=100.0, triton_name="", artifact="", inputs=(), outputs=())


def _format(framework: str | None, batching: dict[str, Any] | None) -> str:
    named = target_format(framework, (batching or {}).get("triton_config"))
    return named.name if named else str(framework or "")


@dataclass(frozen=True)
class EndpointRuntime:
    name: str
    engine: str
    processor: Processor
    targets: tuple[Target, ...]
    preprocess_kind: str = "none"
    io: Mapping[str, Any] = field(default_factory=dict)  # declared inputs/outputs, bound by name
    version_processors: Mapping[int, Processor] = field(default_factory=dict)  # user code: one per version
    prediction_log: LogPolicy | None = None  # which requests the prediction log keeps (None: none)

    def processor_for(self, target: Target) -> Processor:
        """ClearML Serving gives each model version its own ``Preprocess`` instance (its ``load`` read
        that version's file); tokenizers are shared by every version."""
        return self.version_processors.get(target.version, self.processor)

    @property
    def declared_inputs(self) -> tuple[dict, ...]:
        return tuple(self.io.get("inputs") or ())

    @property
    def declared_outputs(self) -> tuple[dict, ...]:
        return tuple(self.io.get("outputs") or ())

    def __post_init__(self) -> None:
        # live versions first: targets[0] is a live one (the default of metadata and user code)
        object.__setattr__(self, "targets", tuple(sorted(self.targets, key=lambda t: t.shadow)))

    @property
    def weights(self) -> list[float]:
        """Routing weights of the answering versions; a shadow's weight is its copy share, not a route."""
        return [0.0 if t.shadow else t.weight for t in self.targets]

    @property
    def shadows(self) -> tuple[Target, ...]:
        return tuple(t for t in self.targets if t.shadow and t.weight > 0)

    def version(self, version: int) -> Target | None:
        return next((t for t in self.targets if t.version == version), None)


@dataclass(frozen=True)
class Config:
    revision: int = -1
    endpoints: Mapping[str, EndpointRuntime] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)  # endpoint -> why it could not be loaded

    @property
    def loaded(self) -> bool:
        return self.revision >= 0

"""Pydantic models at the control plane's HTTP edge."""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
MAX_VERSION = 2**31 - 1  # model versions are 32-bit integers in the database


def finite_json(value: Any, where: str) -> Any:
    """JSON stored as is must be JSON: NaN and Infinity are not (PostgreSQL refuses them)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} must not contain NaN or Infinity")
    if isinstance(value, dict):
        for v in value.values():
            finite_json(v, where)
    elif isinstance(value, list):
        for v in value:
            finite_json(v, where)
    return value

# Engines a worker runs, by name (serving/worker/engines/registry.py); custom ones may have no model.
ENGINES = ("triton", "onnxruntime", "sklearn", "xgboost", "lightgbm", "custom", "custom_async")
MODEL_LESS_ENGINES = ("custom", "custom_async")
FRAMEWORKS = ("onnx", "sklearn", "xgboost", "lightgbm", "pytorch", "tensorflow", "keras", "custom")
Engine = Literal["triton", "onnxruntime", "sklearn", "xgboost", "lightgbm", "custom", "custom_async"]


class TensorSpec(BaseModel):
    name: str
    dtype: str
    shape: list[int]


class Signature(BaseModel):
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


class ModelCreate(BaseModel):
    name: str = Field(pattern=NAME)
    artifact: str = Field(description="sha256 of an uploaded artifact")
    framework: Literal["onnx", "sklearn", "xgboost", "lightgbm", "pytorch", "tensorflow", "keras", "custom"] = "onnx"
    signature: Signature | None = Field(None, description="inferred from the ONNX file when omitted")
    tags: list[str] = []
    metadata: dict[str, Any] = {}

    @field_validator("metadata")
    @classmethod
    def _finite(cls, m: dict[str, Any]) -> dict[str, Any]:
        return finite_json(m, "metadata")


class ModelOut(BaseModel):
    name: str
    version: int
    framework: str
    sha256: str
    size: int
    signature: dict
    tags: list[str]
    metadata: dict
    created_at: str


class Batching(BaseModel):
    max_batch_size: int = Field(32, ge=0, le=4096)
    max_queue_delay_us: int = Field(2000, ge=0, le=10_000_000)
    preferred_batch_sizes: list[int] = []
    instances: int = Field(1, ge=1, le=64)


class PreprocessSpec(BaseModel):
    kind: Literal["tokenizer", "user", "none"] = "none"
    artifact: str | None = None
    options: dict[str, Any] = {}

    @model_validator(mode="after")
    def _artifact_needed(self) -> "PreprocessSpec":
        if self.kind != "none" and not self.artifact:
            raise ValueError(f"preprocess kind '{self.kind}' needs an artifact")
        return self


class DeclaredTensor(BaseModel):
    """One tensor as ClearML Serving's ``--input-name/--input-type/--input-size`` flags declare it."""

    name: str = Field(min_length=1, max_length=256)
    dtype: str | None = Field(None, description="numpy (float32) or Triton (FP32) name; the model's when omitted")
    shape: list[int] | None = Field(None, description="Triton dims: without the batch dimension when batching")


class IODeclaration(BaseModel):
    """Tensors bound by name: what ``preprocess`` returns as a list is matched to ``inputs`` in this order."""

    inputs: list[DeclaredTensor] = []
    outputs: list[DeclaredTensor] = []


class EndpointDeploy(BaseModel):
    """`serving model add`: put a model version behind an endpoint, optionally as a canary."""

    endpoint: str = Field(pattern=NAME)
    model: str | None = Field(None, description="model name; only custom engines may have none")
    version: int | None = Field(None, ge=1, le=MAX_VERSION, description="latest when omitted")
    engine: Engine = "triton"
    preprocess: PreprocessSpec | None = None
    batching: Batching | None = None
    io: IODeclaration | None = Field(None, description="declared inputs/outputs (ClearML Serving flags)")
    max_versions: int | None = Field(None, ge=1, le=100,
                                     description="auto-update: serve the newest N versions of the model as they appear")
    canary: float | None = Field(None, gt=0, lt=100, allow_inf_nan=False,
                                 description="percent of traffic for this version")
    shadow: float | None = Field(None, gt=0, le=100, allow_inf_nan=False,
                                 description="percent of requests copied to this version (never answered)")


class CanaryWeights(BaseModel):
    weights: dict[int, float] = Field(description="model version -> percent of traffic")

    @field_validator("weights")
    @classmethod
    def _valid(cls, w: dict[int, float]) -> dict[int, float]:
        if not w:
            raise ValueError("weights must name at least one version")
        if any(not 1 <= k <= MAX_VERSION for k in w):
            raise ValueError(f"versions must be between 1 and {MAX_VERSION}")
        if any(not math.isfinite(v) for v in w.values()):
            raise ValueError("weights must be finite numbers (no NaN or Infinity)")
        if any(v < 0 for v in w.values()):
            raise ValueError("weights must not be negative")
        if abs(sum(w.values()) - 100.0) > 1e-6:
            raise ValueError(f"weights must add up to 100, got {sum(w.values())}")
        return w


class NewestWeights(BaseModel):
    """ClearML's ``model canary --weights 0.1 0.9 --input-endpoint-prefix E``: weights of the newest
    versions, oldest first; an auto-update endpoint keeps applying them as versions appear."""

    weights: list[float] = Field(min_length=1, max_length=100)

    @field_validator("weights")
    @classmethod
    def _valid(cls, w: list[float]) -> list[float]:
        if any(not math.isfinite(v) or v < 0 for v in w):
            raise ValueError("weights must be finite and not negative")
        total = sum(w)
        if total <= 0:
            raise ValueError("weights must not all be zero")
        return [100.0 * v / total for v in w]  # fractions (0.1 0.9) or percents (10 90) alike


class MetricCreate(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
    kind: Literal["scalar", "enum", "value"]
    buckets: list[float] | None = None
    values: list[str] | None = None

    @model_validator(mode="after")
    def _spec(self) -> "MetricCreate":
        if self.kind == "scalar" and (not self.buckets or sorted(self.buckets) != self.buckets):
            raise ValueError("a scalar variable needs increasing buckets, e.g. 8,16,32")
        if self.kind == "enum" and not self.values:
            raise ValueError("an enum variable needs its values, e.g. cat,dog")
        return self


class LogFreq(BaseModel):
    log_freq: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)


class RolloutStart(BaseModel):
    """`serving rollout start`: move a version's share step by step, gated on its live metrics."""

    endpoint: str = Field(pattern=NAME)
    model: str = Field(pattern=NAME)
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="latest when omitted")
    steps: list[float] = Field(min_length=1, max_length=50, description="percent of traffic at each step, ending at 100")
    interval_s: float = Field(gt=0, le=7 * 86400, allow_inf_nan=False, description="seconds each step lasts")
    max_error_rate: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description="fraction, e.g. 0.01")
    max_p99_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    max_drift: float | None = Field(None, gt=0, allow_inf_nan=False, description="largest PSI of the version's variables")
    min_requests: int = Field(1, ge=1, le=10**9, description="requests the candidate needs in a step to be judged")

    @field_validator("steps")
    @classmethod
    def _steps(cls, steps: list[float]) -> list[float]:
        if any(not math.isfinite(s) or s <= 0 or s > 100 for s in steps):
            raise ValueError("steps are percents above 0 and at most 100")
        if any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError("steps must increase, e.g. 5,25,50,100")
        if steps[-1] != 100:
            raise ValueError("the last step must be 100 (the candidate takes all traffic before it is promoted)")
        return steps

    def gates(self) -> dict[str, Any]:
        return {"max_error_rate": self.max_error_rate, "max_p99_ms": self.max_p99_ms, "max_drift": self.max_drift,
                "min_requests": self.min_requests}

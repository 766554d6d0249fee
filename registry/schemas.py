"""Pydantic models at the control plane's HTTP edge."""
from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from serving.llm.naming import LLM_ENGINES
from serving.prediction_log.policy import FIELDS as LOG_FIELDS, MAX_INPUT_BYTES, check_fields, check_patterns
from serving.triton.naming import SAFE_NAME

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

ENDPOINT_NAME = SAFE_NAME  # a /serve/{endpoint} URL segment as is
MAX_NAME = 128  # model_versions.name and endpoints.name are VARCHAR(128)


def _shown(value: str) -> str:
    return repr(value if len(value) <= 60 else value[:60] + "...")


RESERVED_ENDPOINTS = ("openai", "tei")  # /serve/openai/v1 and /serve/tei/NAME are the workers' other APIs


def endpoint_name(value: str) -> str:
    """Endpoint names are URL path segments (``/serve/NAME``), as ClearML's are."""
    if not ENDPOINT_NAME.fullmatch(value):
        raise ValueError(f"endpoint name {_shown(value)} is not allowed: use 1 to {MAX_NAME} letters, digits, "
                         "'_', '.' or '-', starting with a letter or digit (it is part of the URL /serve/NAME)")
    if value in RESERVED_ENDPOINTS:
        raise ValueError(f"endpoint name {value!r} is reserved: /serve/openai/v1 and /serve/tei/NAME are the "
                         "workers' OpenAI and TEI APIs")
    return value


def model_name(value: str, what: str = "model name") -> str:
    """Model names as ClearML allows them: spaces and any printable character (``train sklearn
    model - sklearn-model``); they travel URL-encoded and map to safe Triton names (serving/triton/naming.py)."""
    if not value or len(value) > MAX_NAME or not value.isprintable() or value != value.strip():
        raise ValueError(f"{what} {_shown(value)} is not allowed: use 1 to {MAX_NAME} printable characters (letters, "
                         "digits, spaces, punctuation), no tabs or line breaks, not starting or ending with a space")
    return value


EndpointName = Annotated[str, AfterValidator(endpoint_name)]
ModelName = Annotated[str, AfterValidator(model_name)]

# Engines a worker runs (the LLM ones listed in serving/llm/naming.py; serving/llm/checks.py checks their engine_options), by name (serving/worker/engines/registry.py); custom ones may have no model.
ENGINES = ("triton", "onnxruntime", "sklearn", "xgboost", "lightgbm", "custom", "custom_async", *LLM_ENGINES,
           "torchserve",  # a TorchServe archive's handler, in the worker (docs/torchserve.md)
           "torch")  # a PyTorch model with torch in the worker, where its ONNX export does not apply
MODEL_LESS_ENGINES = ("custom", "custom_async")
FRAMEWORKS = ("onnx", "sklearn", "xgboost", "lightgbm", "pytorch", "tensorflow", "keras", "custom",
              "tensorrt", "torchscript", "savedmodel", "openvino", "python",  # these five: Triton formats
              "hf-causal-lm",  # a Hugging Face causal LM folder (engine vllm)
              "hf-lora",  # a PEFT LoRA adapter folder, served in its base's engine (serving/llm/adapters/peft.py)
              "torchserve",  # a TorchServe model archive (.mar, torch-model-archiver), engine torchserve
              "torch-export", "pytorch-state-dict")  # with torchscript: engine torch (serving/pytorch/kinds.py)
Engine = Literal[ENGINES]
OPTION_ENGINES = (*LLM_ENGINES, "torchserve")  # engine_options (and --aux-config pairs) belong to these


class TensorSpec(BaseModel):
    name: str
    dtype: str
    shape: list[int]


class Signature(BaseModel):
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


class ModelCreate(BaseModel):
    name: ModelName
    artifact: str = Field(description="sha256 of an uploaded artifact")
    framework: Literal[FRAMEWORKS] = "onnx"
    signature: Signature | None = Field(None, description="inferred from the ONNX file, a Triton model's "
                                                          "config.pbtxt or a causal LM's config.json when omitted")
    tags: list[str] = []
    metadata: dict[str, Any] = {}
    base: str | None = Field(None, max_length=256, description="hf-lora: the version the adapter was trained on, "
                                                               "NAME:VERSION")

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
    triton_config: dict[str, Any] = Field({}, description="other config.pbtxt fields (ClearML's --aux-config), "
                                                          "written into an external Triton's config.pbtxt")

    @field_validator("triton_config")
    @classmethod
    def _triton_schema(cls, tree: dict[str, Any]) -> dict[str, Any]:
        if tree:
            from serving.triton.aux_config import check_triton_config

            check_triton_config(tree)  # an AuxConfigError is a ValueError: a 422 naming the field
        return tree


class PreprocessSpec(BaseModel):
    kind: Literal["tokenizer", "user", "none"] = "none"
    artifact: str | None = None
    options: dict[str, Any] = {}

    @model_validator(mode="after")
    def _artifact_needed(self) -> "PreprocessSpec":
        if self.kind != "none" and not self.artifact:
            raise ValueError(f"preprocess kind '{self.kind}' needs an artifact")
        if self.kind == "tokenizer":
            from preprocess.encoder import check_options

            check_options(self.options)  # an encoder's task, pooling, limits (docs/embeddings.md)
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

    endpoint: EndpointName
    model: ModelName | None = Field(None, description="model name; only custom engines may have none")
    version: int | None = Field(None, ge=1, le=MAX_VERSION, description="latest when omitted")
    engine: Engine | None = Field(None, description="default: the one the model's format implies (a TorchServe "
                                                    "archive: torchserve), else triton")
    preprocess: PreprocessSpec | None = None
    batching: Batching | None = None
    io: IODeclaration | None = Field(None, description="declared inputs/outputs (ClearML Serving flags)")
    max_versions: int | None = Field(None, ge=1, le=100,
                                     description="auto-update: serve the newest N versions of the model as they appear")
    canary: float | None = Field(None, gt=0, lt=100, allow_inf_nan=False,
                                 description="percent of traffic for this version")
    shadow: float | None = Field(None, gt=0, le=100, allow_inf_nan=False,
                                 description="percent of requests copied to this version (never answered)")
    aux_config: dict[str, str] | None = Field(None, description="ClearML's --aux-config: config.pbtxt key -> value "
                                                                "as typed, e.g. max_batch_size: \"64\"; for engine "
                                                                "vllm its engine options, e.g. max_model_len: \"512\"")
    engine_options: dict[str, Any] | None = Field(None, description="engine vllm: dtype, max_model_len, ... "
                                                                    "(docs/llm-engine.md); kept when omitted")

    @field_validator("aux_config")
    @classmethod
    def _aux_valid(cls, pairs: dict[str, str] | None, info: ValidationInfo) -> dict[str, str] | None:
        if pairs and info.data.get("engine") not in OPTION_ENGINES:
            aux_batching(pairs, None, None)  # refused here, so the 422 names aux_config
        return pairs

    @model_validator(mode="after")
    def _engine_options(self) -> "EndpointDeploy":
        """Engine vllm: --aux-config pairs are its options (explicit engine_options win), checked here so the
        422 names the option; other engines have none."""
        if self.engine not in OPTION_ENGINES:
            if self.engine_options:
                raise ValueError(f"engine_options are for engine {' or '.join(OPTION_ENGINES)}, not {self.engine}")
            return self
        if self.aux_config is None and self.engine_options is None:
            return self
        if self.engine == "torchserve":  # batch size, delay, timeout, handler processes (serving/torchserve/options.py)
            from serving.torchserve.options import check_options as check_torchserve

            self.engine_options = check_torchserve({**(self.aux_config or {}), **(self.engine_options or {})})
            return self
        from serving.llm.checks import check_options, options_from_aux

        self.engine_options = check_options({**options_from_aux(self.aux_config or {}), **(self.engine_options or {})})
        return self

    @model_validator(mode="after")
    def _aux(self) -> "EndpointDeploy":
        """Batching keys of --aux-config apply here (explicit batching fields win); other config.pbtxt
        keys go to an external Triton; platform and model file name are known already (ignored)."""
        if self.aux_config and self.engine not in OPTION_ENGINES:
            self.batching = aux_batching(self.aux_config, self.batching, self.io) or self.batching
        return self


def aux_batching(pairs: dict[str, str], batching: Batching | None, io: IODeclaration | None) -> Batching | None:
    """The endpoint's batching with ClearML's --aux-config applied; None when it sets nothing used here."""
    from serving.triton.aux_config import APPLIED, AuxConfigError, parse_aux

    try:
        aux = parse_aux(pairs)
    except AuxConfigError as exc:
        raise ValueError(str(exc)) from None
    if not (aux.batching or aux.triton):
        return None
    explicit = batching.model_dump(include=batching.model_fields_set) if batching else {}
    merged = {"max_batch_size": 0 if io else 32, **aux.batching, **explicit,
              "triton_config": {**aux.triton, **explicit.get("triton_config", {})}}
    try:
        return Batching(**merged)
    except ValidationError as exc:
        names = {v: k for k, v in APPLIED.items()}
        raise ValueError("; ".join(f"{names.get(str(e['loc'][0]), e['loc'][0])}: {e['msg']}"
                                   for e in exc.errors())) from None


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
    name: str
    kind: Literal["scalar", "enum", "value"]
    buckets: list[float] | None = None
    values: list[str] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,63}", name):
            raise ValueError(f"variable name {_shown(name)} is not allowed: use 1 to 64 letters, digits or '_', "
                             "not starting with a digit (it becomes a Prometheus label value and a JSON key)")
        return name

    @model_validator(mode="after")
    def _spec(self) -> "MetricCreate":
        if self.kind == "scalar" and (not self.buckets or sorted(self.buckets) != self.buckets):
            raise ValueError("a scalar variable needs increasing buckets, e.g. 8,16,32")
        if self.kind == "enum" and not self.values:
            raise ValueError("an enum variable needs its values, e.g. cat,dog")
        return self


class LogFreq(BaseModel):
    log_freq: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)


class PredictionLog(BaseModel):
    """``serving endpoint log``: the share of requests the prediction log keeps, what of each, and what
    to hide (serving/prediction_log/policy.py). ``sample`` 0 turns it off."""

    sample: float = Field(ge=0.0, le=100.0, allow_inf_nan=False, description="percent of requests logged")
    fields: list[str] | None = Field(None, description=f"kept besides the request's identity, of {', '.join(LOG_FIELDS)}; "
                                                       "omitted: all")
    redact: list[str] = Field(default_factory=list, description="regular expressions; matches become [REDACTED]")
    max_bytes: int = Field(MAX_INPUT_BYTES, ge=256, le=16 * 1_048_576,
                           description="inputs or outputs whose JSON is longer are summarized")

    @field_validator("fields")
    @classmethod
    def _fields(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else check_fields(value)

    @field_validator("redact")
    @classmethod
    def _redact(cls, value: list[str]) -> list[str]:
        return check_patterns(value)

    def stored(self) -> dict | None:
        """What the registry keeps and pushes: None when off."""
        if self.sample == 0:
            return None
        return {"sample": self.sample, "fields": self.fields or list(LOG_FIELDS), "redact": self.redact,
                "max_bytes": self.max_bytes}


class RolloutStart(BaseModel):
    """`serving rollout start`: move a version's share step by step, gated on its live metrics."""

    endpoint: EndpointName
    model: ModelName
    version: int | None = Field(None, ge=1, le=2**31 - 1, description="latest when omitted")
    steps: list[float] = Field(min_length=1, max_length=50, description="percent of traffic at each step, ending at 100")
    interval_s: float = Field(gt=0, le=7 * 86400, allow_inf_nan=False, description="seconds each step lasts")
    max_error_rate: float | None = Field(None, ge=0, le=1, allow_inf_nan=False, description="fraction, e.g. 0.01")
    max_p99_ms: float | None = Field(None, gt=0, allow_inf_nan=False)
    max_drift: float | None = Field(None, gt=0, allow_inf_nan=False, description="largest PSI of the version's variables")
    max_ttft_p99_ms: float | None = Field(None, gt=0, allow_inf_nan=False, description="LLM: time to first token p99")
    max_itl_p99_ms: float | None = Field(None, gt=0, allow_inf_nan=False, description="LLM: inter-token latency p99")
    min_requests: int = Field(1, ge=1, le=10**9, description="requests the candidate needs in a step to be judged")
    max_accuracy_drop: float | None = Field(None, ge=0, le=1, allow_inf_nan=False,
                                            description="live accuracy (from feedback) the candidate may lose against "
                                                        "the stable version, e.g. 0.02")
    min_labelled: int = Field(1, ge=1, le=10**9, description="labelled requests each version needs for the accuracy gate")

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
        gates = {"max_error_rate": self.max_error_rate, "max_p99_ms": self.max_p99_ms, "max_drift": self.max_drift,
                 "min_requests": self.min_requests}
        llm = {"max_ttft_p99_ms": self.max_ttft_p99_ms, "max_itl_p99_ms": self.max_itl_p99_ms}
        accuracy = ({"max_accuracy_drop": self.max_accuracy_drop, "min_labelled": self.min_labelled}
                    if self.max_accuracy_drop is not None else {})
        return {**gates, **{k: v for k, v in llm.items() if v is not None}, **accuracy}

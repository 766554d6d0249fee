"""What every engine pod looks like, from the chart's values (``llm.engines``), and what a version's
``--aux-config`` may change of it.

Why pydantic here: the template arrives as one JSON setting written by Helm (``SERVING_LLM_KUBE_ENGINE``),
and a typo in a values file should stop the launcher with the field's name, not make pods that fail.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# what an endpoint's engine options may set for its engine's pods (--aux-config image=... gpus=2 ...)
POD_OPTIONS = ("image", "gpus", "cpu", "memory")


class TokenSecret(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    key: str


class EngineAutoscaling(BaseModel):
    """Each engine's HPA on its own signals (the control plane's external metrics API, selected by engine)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    api_version: str = "autoscaling/v2beta2"  # the chart's pick for the cluster (v2 from 1.23)
    min_replicas: int = Field(1, ge=1)
    max_replicas: int = Field(4, ge=1)
    waiting_requests_per_replica: float | None = Field(4, gt=0)  # vllm:num_requests_waiting, per replica
    kv_cache_usage: float | None = Field(None, gt=0, le=1)        # the pods' mean, 0 to 1
    ttft_milliseconds: float | None = Field(None, gt=0)           # mean time to first token over 10 s
    behavior: dict[str, Any] = Field(default_factory=dict)

    def targets(self) -> list[tuple[str, str, float]]:
        """(metric, target type, value) of each target set."""
        named = [("serving_llm_waiting_requests", "AverageValue", self.waiting_requests_per_replica),
                 ("serving_llm_kv_cache_usage", "Value", self.kv_cache_usage),
                 ("serving_llm_ttft_ms", "Value", self.ttft_milliseconds)]
        return [(m, kind, v) for m, kind, v in named if v is not None]


class EngineTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    release: str                         # the chart's full name: prefixes the engines' names, labels them
    owner: str | None = None             # the control plane's Deployment: owns the engines (helm uninstall's GC)
    image: str                           # vLLM's image (vllm/vllm-openai on GPUs)
    pull_policy: str = "IfNotPresent"
    python: str = "python3"              # the image's interpreter with vllm installed
    port: int = 8000
    init_image: str                      # the platform's image: its init container fetches the model folder
    init_pull_policy: str = "IfNotPresent"
    control_plane_url: str               # where the init container downloads /artifacts/{sha256}
    worker_token: TokenSecret | None = None  # the Secret holding the worker token the download needs
    gpus: int = 0                        # nvidia.com/gpu per pod
    resources: dict[str, Any] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    extra_args: list[str] = Field(default_factory=list)  # before a version's own extra_args
    kv_cache_gb: float | None = None     # CPU engines' KV cache; on GPUs vLLM sizes it (gpu_memory_utilization)
    shm_size: str = "1Gi"
    env: dict[str, str] = Field(default_factory=dict)
    startup_seconds: int = 900           # loading weights (and compiling) may take this long
    autoscaling: EngineAutoscaling | None = None  # None: a version's replicas= is the count

    def for_options(self, options: dict[str, Any]) -> "EngineTemplate":
        """This template with what the version's options set for its pods."""
        changes: dict[str, Any] = {}
        if options.get("image"):
            changes["image"] = str(options["image"])
        if options.get("gpus") not in (None, ""):
            changes["gpus"] = int(options["gpus"])
        asked = {k: str(options[k]) for k in ("cpu", "memory") if options.get(k) not in (None, "")}
        if asked:
            resources = {k: dict(v) for k, v in self.resources.items()}
            for part in ("requests", "limits"):
                resources[part] = {**resources.get(part, {}), **asked}
            changes["resources"] = resources
        return self.model_copy(update=changes)

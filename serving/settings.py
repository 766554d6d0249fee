"""Settings shared by every process, read from the environment (prefix ``SERVING_``).

One variable name means one thing everywhere: the compose file and the Helm chart
pass exactly these names, and a test compares them with this module.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    return Path.home() / ".serving"


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVING_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    control_plane_url: str = "http://127.0.0.1:8080"
    artifact_dir: Path | None = None  # shared artifact store path, when mounted
    worker_token: str | None = None  # worker role token (config stream, artifacts, statistics); else $HOME/tokens/worker
    # TorchServe's install_py_dep_per_model: a TorchServe archive's requirements.txt is installed by the
    # workers (serving/torchserve/); off, such an archive is refused at upload (docs/torchserve.md)
    install_py_dep_per_model: bool = False
    # tracing (docs/tracing.md): an OTLP/HTTP collector (http://collector:4318); unset: off. The worker, the
    # embedded Triton and the LLM launcher's vLLM engines export there. sample: the share of new traces kept
    tracing_otlp_endpoint: str | None = None
    tracing_sample: float = Field(1.0, ge=0.0, le=1.0)

    def resolved_artifact_dir(self) -> Path:
        return self.artifact_dir or self.home / "artifacts"


class ControlPlaneSettings(CommonSettings):
    database_url: str | None = None
    control_plane_host: str = "127.0.0.1"
    control_plane_port: int = 8080
    triton_model_repository: Path | None = None
    triton_control_url: str | None = None
    admin_token: str | None = None  # bootstrap admin token; unset: $SERVING_HOME/tokens/admin, created 0600
    max_artifact_bytes: int = 2 * 1024**3  # one upload past it: 413, its temp file removed
    # rollout gates read the statistics service's /metrics, or a Prometheus scraping it when set
    statistics_host: str = "127.0.0.1"
    statistics_port: int = 9999
    statistics_url: str | None = None
    prometheus_url: str | None = None
    rollout_tick_s: float = 0.5
    # the web console's playground sends requests here (docs/console.md); unset: the local workers
    console_data_plane_url: str | None = None
    # seconds between two samples of the statistics the console keeps for its rates and charts
    console_sample_s: float = Field(5.0, gt=0, le=300)
    # TorchServe's management API (registry/torchserve_api.py) on a port of its own, bound to
    # control_plane_host and served by the control plane's process; 0: not served
    torchserve_management_port: int = Field(8081, ge=0, le=65535)
    # TorchServe's --model-store: POST /models?url=NAME.mar reads NAME.mar from here; unset: $SERVING_HOME/model-store
    torchserve_model_store: Path | None = None
    # Kubernetes' external metrics API for HPAs (registry/autoscaling/, docs/deploy-helm.md#autoscaling) on a
    # TLS port of its own; 0: not served. Its serving certificate and key, the CA of the API server's
    # front-proxy client certificate (unset in a pod: read from kube-system), the pods to sample (host:port of
    # a headless Service: the workers' /metrics, Triton's metrics port, the vLLM pods) and the namespace it
    # answers for (unset: the pod's)
    metrics_api_port: int = Field(0, ge=0, le=65535)
    metrics_api_cert: Path | None = None
    metrics_api_key: Path | None = None
    metrics_api_client_ca: Path | None = None
    autoscaling_workers: str | None = None
    autoscaling_triton: str | None = None
    autoscaling_llm: str | None = None
    autoscaling_llm_engines_port: int | None = None  # the launcher's engines (llmEngines): their pods' port
    autoscaling_namespace: str | None = None
    signals_port: int = Field(0, ge=0, le=65535)  # the same signals as JSON for KEDA's metrics-api scaler; 0: off

    def resolved_torchserve_model_store(self) -> Path:
        return self.torchserve_model_store or self.home / "model-store"

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'registry.db'}"

    def resolved_statistics_url(self) -> str:
        host = "127.0.0.1" if self.statistics_host in ("0.0.0.0", "::", "") else self.statistics_host
        return self.statistics_url or f"http://{host}:{self.statistics_port}"


class WorkerSettings(CommonSettings):
    worker_host: str = "127.0.0.1"
    worker_port: int = 9090
    worker_grpc_port: int = 9091  # v2 protocol over gRPC in every worker process; 0: off
    # several worker processes: "connections" (the manager hands each new connection to the process
    # holding the fewest; serving/worker/handoff.py) or "kernel" (a SO_REUSEPORT socket per process)
    worker_balance: Literal["connections", "kernel"] = "connections"
    worker_cache: Path | None = None
    # told to stop (SIGTERM: a rolling upgrade, `serving up` stopping), a worker stops taking requests and gives
    # those under way this long to finish before it cancels them (a cancelled one would answer 500); the Helm
    # chart keeps it under the pod's terminationGracePeriodSeconds less its preStop sleep
    worker_graceful_stop_s: float = 20.0
    # a client's keep-alive connection older than this is closed after its next answer, so that a Service
    # spreads that client over workers added since (serving/worker/connection_age.py); 0: never
    worker_max_connection_age_s: float = Field(0.0, ge=0)
    max_body_bytes: int = 1_048_576
    # one Triton "host:port"; several: "host:port,host:port", or "dns:///name:port" (every address the name
    # resolves to, e.g. a headless Service's pods), spread and failed over (serving/worker/engines/triton_pool.py)
    triton_grpc_url: str = "127.0.0.1:8001"
    triton_resolve_period_s: float = 5.0  # "dns:///" Triton address: resolved again this often
    # the embedded Triton's load-on-demand endpoint (memory budget); empty: none, so the worker token is
    # never sent to a port nobody configured
    triton_loader_url: str = ""
    kafka_bootstrap_servers: str | None = None
    kafka_topic: str = "serving-statistics"
    statistics_host: str = "127.0.0.1"
    statistics_port: int = 9999
    statistics_enabled: bool = True  # off only to measure what recording costs
    # the prediction log (docs/prediction-log.md): where the records of endpoints that log go
    prediction_log_sink: Literal["files", "kafka", "off"] = "files"
    prediction_log_dir: Path | None = None  # files: default <home>/predictions
    prediction_log_topic: str = "serving-predictions"  # kafka: compose and Helm name one per deployment
    prediction_log_max_queue: int = 10_000  # records held while the sink is slow or down; past it dropped, counted
    prediction_log_file_mb: int = 64        # files: a new file past this size
    prediction_log_keep_files: int = 20     # files: per worker process; the oldest past this are deleted
    ort_threads: int = 1             # onnxruntime engine: intra-op threads of one inference
    ort_parallel: int = 0            # onnxruntime engine: inferences at once per process; 0: one per core
    torch_threads: int = 1           # torch engine: intra-op threads (torch.set_num_threads) of each worker process
    worker_memory_budget_mb: int = 0  # onnxruntime engine: its sessions' memory per process; 0: no budget, all loaded
    infer_timeout_s: float = 30.0    # per Triton call; past it the client gets a 503
    worker_batching: bool = False    # merge concurrent requests for one Triton model into one padded call
    user_code_timeout_s: float = 60.0  # deadline of one call into preprocess.py; past it a 504
    pipeline_url: str | None = None  # send_request to endpoints this worker lacks; default: its own /serve
    extra_python_packages: str = ""  # pip requirements installed at worker start (ClearML's EXTRA_PYTHON_PACKAGES)
    client_keys_required: bool = False  # /serve and /v2 need a client key (serving key create); compose/Helm: true
    llm_launcher_url: str = "http://127.0.0.1:8004"  # vllm engine: the launcher's /engines map (serving up sets it)
    llm_timeout_s: float = 600.0  # vllm engine: longest wait for an LLM engine's answer or next streamed bytes
    # vllm engine: requests held per engine and worker process while an engine scaled to zero wakes; more are
    # a 503 at once, and one held this long a 503 (serving/llm/engines/wake.py)
    llm_hold_max: int = Field(64, ge=1)
    llm_hold_s: float = Field(180.0, gt=0)

    def resolved_cache(self) -> Path:
        return self.worker_cache or self.home / "worker-config.json"

    def resolved_prediction_log_dir(self) -> Path:
        return self.prediction_log_dir or self.home / "predictions"

    def resolved_pipeline_url(self) -> str:
        host = "127.0.0.1" if self.worker_host in ("0.0.0.0", "::", "") else self.worker_host
        return self.pipeline_url or f"http://{host}:{self.worker_port}/serve"

    def resolved_ort_parallel(self) -> int:
        """One inference per core, in every process: uvicorn's processes share one listening socket
        and the kernel hands connections out unevenly, so sizing by cores / processes would leave
        a busy process short of threads while another idles. With one intra-op thread each, an
        oversubscribed core only time-slices; it never spins."""
        import os

        return self.ort_parallel or os.cpu_count() or 1


class TritonSettings(CommonSettings):
    triton_http_port: int = 8000
    triton_grpc_port: int = 8001
    triton_metrics_port: int = 8002
    triton_host: str = "127.0.0.1"
    triton_ort_threads: int = 0      # embedded triton: onnxruntime intra-op threads per model; 0: cores
    triton_memory_budget_mb: int = 0  # embedded triton: models' memory (stubs' RSS); 0: no budget, all loaded
    triton_loader_port: int = 8003    # embedded triton: load-on-demand endpoint for workers (with a budget)
    # GET /ready: 200 once every deployed model is loaded (a pod's readinessProbe; serving/triton/pod_readiness.py);
    # 0: not served (the chart sets it)
    triton_readiness_port: int = 0


class TritonSidecarSettings(CommonSettings):
    """`serving triton-sidecar`: loads one Triton pod's models (serving/triton/sidecar.py)."""

    triton_model_repository: Path | None = None  # the pod's own repository (shared with tritonserver); default HOME/models
    triton_control_url: str = "http://127.0.0.1:8000"  # that tritonserver's HTTP API, over localhost
    triton_host: str = "127.0.0.1"   # where GET /ready listens (a pod: 0.0.0.0, for the kubelet)
    triton_readiness_port: int = 8005

    def resolved_model_repository(self) -> Path:
        return self.triton_model_repository or self.home / "models"


def bundled_vllm_python() -> Path | None:
    """scripts/setup.sh's engine venv beside this checkout (``.venv-vllm``), when there is one."""
    candidate = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"
    return candidate if candidate.exists() else None


class LLMSettings(CommonSettings):
    """`serving llm`: the launcher of the vLLM engines of LLM endpoints (docs/llm-engine.md)."""

    llm_launcher_host: str = "127.0.0.1"
    llm_launcher_port: int = 8004       # GET /engines: where each engine answers and its state
    vllm_python: Path | None = Field(default_factory=bundled_vllm_python)  # the vLLM venv's interpreter
    vllm_kv_cache_gb: float = 1.0       # KV cache per engine on CPU (endpoint option kv_cache_space_gb wins)
    # vLLM flags every engine gets, before an endpoint's own extra_args (a JSON list: '["-O0"]')
    vllm_default_args: list[str] = Field(default_factory=list)
    vllm_start_timeout_s: float = 600.0  # an engine not answering /health by then is restarted
    llm_max_crashes: int = Field(5, ge=1)  # an engine's exits within 15 min before it is given up (failed)
    llm_memory_budget_mb: int = 0       # engines' memory (their processes' RSS); 0: no budget, all started
    llm_gpus: str | None = None         # GPU ids engine replicas are placed on ("0,1,2,3"); unset: CPU cores
    # on Kubernetes (the chart's llm.engines): engines are Deployments the launcher makes through the API,
    # their pods as the template says (JSON, serving/llm/kube/template.py)
    llm_on_kubernetes: bool = False
    llm_kube_engine: dict[str, Any] = Field(default_factory=dict)
    # with two control planes: the local one's GET /leadership; only the leader's launcher changes the cluster
    # (serving/llm/kube/acting.py). Unset: this launcher always acts (one control plane)
    llm_leader_url: str | None = None


class StatisticsSettings(CommonSettings):
    statistics_port: int = 9999
    statistics_host: str = "127.0.0.1"
    kafka_bootstrap_servers: str | None = None
    kafka_topic: str = "serving-statistics"
    # ground truth (serving/statistics/ground_truth.py): logged requests remembered for feedback, and the
    # live window of serving_live_accuracy / serving_live_mae
    feedback_max_requests: int = Field(1_000_000, ge=1)
    feedback_window_s: float = Field(3600.0, gt=0)

"""Settings shared by every process, read from the environment (prefix ``SERVING_``).

One variable name means one thing everywhere: the compose file and the Helm chart
pass exactly these names, and a test compares them with this module.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_home() -> Path:
    return Path.home() / ".serving"


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SERVING_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    control_plane_url: str = "http://127.0.0.1:8080"
    artifact_dir: Path | None = None  # shared artifact store path, when mounted

    def resolved_artifact_dir(self) -> Path:
        return self.artifact_dir or self.home / "artifacts"


class ControlPlaneSettings(CommonSettings):
    database_url: str | None = None
    control_plane_host: str = "127.0.0.1"
    control_plane_port: int = 8080
    triton_model_repository: Path | None = None
    triton_control_url: str | None = None

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'registry.db'}"


class WorkerSettings(CommonSettings):
    worker_host: str = "127.0.0.1"
    worker_port: int = 9090
    worker_cache: Path | None = None
    max_body_bytes: int = 1_048_576
    triton_grpc_url: str = "127.0.0.1:8001"
    kafka_bootstrap_servers: str | None = None
    kafka_topic: str = "serving-statistics"
    statistics_host: str = "127.0.0.1"
    statistics_port: int = 9999
    statistics_enabled: bool = True  # off only to measure what recording costs
    workers: int = 1                 # processes on this port; sizes onnxruntime's thread pool
    ort_threads: int = 0             # onnxruntime intra-op threads per process; 0: cores / workers
    infer_timeout_s: float = 30.0    # per Triton call; past it the client gets a 503

    def resolved_cache(self) -> Path:
        return self.worker_cache or self.home / "worker-config.json"

    def resolved_ort_threads(self) -> int:
        import os

        return self.ort_threads or max(1, (os.cpu_count() or 1) // max(1, self.workers))


class TritonSettings(CommonSettings):
    triton_http_port: int = 8000
    triton_grpc_port: int = 8001
    triton_metrics_port: int = 8002
    triton_host: str = "127.0.0.1"


class StatisticsSettings(CommonSettings):
    statistics_port: int = 9999
    statistics_host: str = "127.0.0.1"
    kafka_bootstrap_servers: str | None = None
    kafka_topic: str = "serving-statistics"

"""Registry tables. Alembic migrations in ``registry/migrations`` create them."""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import JSON, BigInteger, Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def stamp(seconds: float) -> datetime:
    """A time in seconds since the epoch, as the tables store it (UTC)."""
    return datetime.fromtimestamp(seconds, timezone.utc)


def seconds_of(at: datetime) -> float:
    """A stored time in seconds since the epoch: SQLite hands it back without its zone; it was stored in UTC."""
    return (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()


class Base(DeclarativeBase):
    pass


class ModelVersion(Base):
    __tablename__ = "model_versions"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_model_name_version"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), index=True)
    version: Mapped[int] = mapped_column(Integer)
    framework: Mapped[str] = mapped_column(String(32))
    sha256: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    signature: Mapped[dict] = mapped_column(JSON)
    tags: Mapped[list] = mapped_column(JSON, default=list)
    meta: Mapped[dict] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Endpoint(Base):
    __tablename__ = "endpoints"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    engine: Mapped[str] = mapped_column(String(32))
    preprocess: Mapped[dict] = mapped_column(JSON, default=dict)
    batching: Mapped[dict] = mapped_column(JSON, default=dict)
    log_freq: Mapped[float] = mapped_column(Float, default=1.0)
    io: Mapped[dict] = mapped_column(JSON, default=dict)  # declared inputs/outputs, bound by name
    auto_update: Mapped[dict] = mapped_column(JSON, default=dict)  # {"model", "max_versions", "weights"}
    engine_options: Mapped[dict] = mapped_column(JSON, default=dict)  # engine vllm: checked options (serving/llm)
    prediction_log: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # serving/prediction_log: null is off
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    targets: Mapped[list["EndpointTarget"]] = relationship(
        back_populates="endpoint", cascade="all, delete-orphan", order_by="EndpointTarget.id"
    )
    metrics: Mapped[list["MetricDefinition"]] = relationship(
        back_populates="endpoint", cascade="all, delete-orphan", order_by="MetricDefinition.name"
    )


class EndpointTarget(Base):
    """One weighted route of an endpoint: the stable version, or a canary."""

    __tablename__ = "endpoint_targets"
    __table_args__ = (UniqueConstraint("endpoint_id", "model_id", name="uq_target"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    weight: Mapped[float] = mapped_column(Float)
    role: Mapped[str] = mapped_column(String(16), default="stable")  # stable | canary

    endpoint: Mapped[Endpoint] = relationship(back_populates="targets")
    model: Mapped[ModelVersion] = relationship()


class MetricDefinition(Base):
    __tablename__ = "metric_definitions"
    __table_args__ = (UniqueConstraint("endpoint_id", "name", name="uq_metric"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))  # scalar | enum | value
    spec: Mapped[dict] = mapped_column(JSON, default=dict)  # {"buckets": [...]} / {"values": [...]}

    endpoint: Mapped[Endpoint] = relationship(back_populates="metrics")


class ConfigState(Base):
    """A single row whose revision every registry change bumps in the same transaction."""

    __tablename__ = "config_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    revision: Mapped[int] = mapped_column(Integer, default=0)


class ApiToken(Base):
    """A control-plane credential: only its sha256 is stored; the token is shown once, at creation."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # admin | deployer | viewer | worker
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    upload_quota_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    uploaded_bytes: Mapped[int] = mapped_column(BigInteger, default=0)


class ClientKey(Base):
    """A data-plane credential: its sha256, the endpoints it may call (None: all) and its rate.
    Workers get these rows (never the key) in the config snapshot and check requests themselves."""

    __tablename__ = "client_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    endpoints: Mapped[list | None] = mapped_column(JSON, nullable=True)  # None: every endpoint
    rate: Mapped[float | None] = mapped_column(Float, nullable=True)  # requests per second; None: no limit
    burst: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)  # LLM tokens; None: no limit
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class AuditEntry(Base):
    """One change made through the control plane: who (token name), what, when."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    target: Mapped[str] = mapped_column(String(256))
    detail: Mapped[dict] = mapped_column(JSON, default=dict)


class Rollout(Base):
    """A progressive rollout of one model version on one endpoint, persisted so a restart resumes it."""

    __tablename__ = "rollouts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[int] = mapped_column(ForeignKey("endpoints.id", ondelete="CASCADE"))
    model_id: Mapped[int] = mapped_column(ForeignKey("model_versions.id"))
    state: Mapped[str] = mapped_column(String(16))  # running | paused | succeeded | rolled_back | aborted
    steps: Mapped[list] = mapped_column(JSON)  # percents of traffic, e.g. [5, 25, 50, 100]
    step_index: Mapped[int] = mapped_column(Integer, default=0)
    interval_s: Mapped[float] = mapped_column(Float)
    gates: Mapped[dict] = mapped_column(JSON, default=dict)  # max_error_rate, max_p99_ms, max_drift
    reason: Mapped[str] = mapped_column(String(2048), default="")
    history: Mapped[list] = mapped_column(JSON, default=list)  # [{"at", "step", "weight", "observed"}]
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    next_step_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)

    endpoint: Mapped[Endpoint] = relationship()
    model: Mapped[ModelVersion] = relationship()


class ReadinessRecord(Base):
    """The last readiness report of one worker process, Triton or LLM launcher (registry/readiness.py), in the
    database so that every control-plane replica sees the reports any of them received."""

    __tablename__ = "readiness_reports"

    source: Mapped[str] = mapped_column(String(200), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # worker | triton | llm
    revision: Mapped[int] = mapped_column(Integer)
    report: Mapped[dict] = mapped_column(JSON)  # the report as posted (ReadinessReport)
    received_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)


class ConsoleSessionRecord(Base):
    """A console sign-in session (registry/console/sessions.py), in the database so that every control-plane
    replica knows it. Holds no session id and no readable token: its key is a hash of the id, and the token is
    sealed under a key derived from the id, which only the browser's cookie carries."""

    __tablename__ = "console_sessions"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    sealed: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(String(200))
    role: Mapped[str] = mapped_column(String(16))
    notice: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    opened_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)

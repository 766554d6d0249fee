"""The worker's spans, through OpenTelemetry's SDK, exported over OTLP/HTTP to the collector the settings
name; nothing at all while tracing is off (the default).

Why a facade over the SDK: the request path calls it at every hop, and with tracing off each call must
cost a flag test, not a tracer lookup and a no-op span; and one place decides the span names and the
propagation (W3C trace context), for the engines that pass it on.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

_tracer: Any = None
_provider: Any = None
EXPORT_EVERY_MS = 1000  # finished spans wait at most this long in the worker before they are sent


def enabled() -> bool:
    return _tracer is not None


def configure(endpoint: str | None, sample: float = 1.0, service: str = "serving-worker") -> bool:
    """Export to ``endpoint`` (``http://collector:4318``; ``/v1/traces`` is added) a ``sample`` share of new
    traces (a client's sampled flag is followed); None or empty: tracing stays off."""
    global _tracer, _provider
    if not endpoint:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    _provider = TracerProvider(resource=Resource.create({"service.name": service}),
                               sampler=ParentBased(TraceIdRatioBased(max(0.0, min(1.0, sample)))))
    _provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint)),
                                                     schedule_delay_millis=EXPORT_EVERY_MS))
    _tracer = _provider.get_tracer("serving")
    return True


def flush(timeout_s: float = 10.0) -> bool:
    """Export the finished spans now (tests, and a worker about to stop)."""
    return _provider is None or _provider.force_flush(int(timeout_s * 1000))


def traces_url(endpoint: str) -> str:
    return endpoint.rstrip("/") if endpoint.rstrip("/").endswith("/v1/traces") else endpoint.rstrip("/") + "/v1/traces"


def shutdown() -> None:
    """Export what is buffered (a stopping worker)."""
    global _tracer, _provider
    if _provider is not None:
        _provider.shutdown()
    _tracer = _provider = None


@contextmanager
def request_span(name: str, traceparent: str | None, **attributes: Any) -> Iterator[Any]:
    """The server span of one request, the client's trace continued when it sent one; current while the
    request runs (its context variable), so inner spans and the engines' headers hang from it."""
    if _tracer is None:
        yield None
        return
    from opentelemetry import context, trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent}) if traceparent else None
    span = _tracer.start_span(name, context=parent, kind=trace.SpanKind.SERVER, attributes=attributes)
    token = context.attach(trace.set_span_in_context(span))
    try:
        yield span
    finally:
        context.detach(token)
        span.end()


@contextmanager
def span(name: str, **attributes: Any) -> Iterator[Any]:
    """A span of a hop inside the request (route, preprocess, engine, postprocess), current while it runs."""
    if _tracer is None:
        yield None
        return
    with _tracer.start_as_current_span(name, attributes={k: v for k, v in attributes.items() if v is not None}) as s:
        yield s


def start(name: str, **attributes: Any) -> Any:
    """A span that outlives the block that starts it (an engine's stream, ended when the stream ends);
    the caller ends it with :func:`end`. None while tracing is off."""
    if _tracer is None:
        return None
    return _tracer.start_span(name, attributes={k: v for k, v in attributes.items() if v is not None})


def end(started: Any, status: int | None = None) -> None:
    if started is not None:
        if status is not None:
            started.set_attribute("http.status_code", status)
        started.end()


def headers(started: Any = None) -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of ``started`` or of the current span, for an engine's request:
    Triton (gRPC metadata) and vLLM (HTTP headers) continue the trace from there. Empty while off."""
    if _tracer is None:
        return {}
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    context = trace.set_span_in_context(started) if started is not None else None
    TraceContextTextMapPropagator().inject(carrier, context=context)
    return carrier


def trace_id() -> str | None:
    """The current trace's id (32 hex), for log records and error bodies; None while off or unsampled."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None


@contextmanager
def within(started: Any) -> Iterator[None]:
    """``started`` (from :func:`start`) is the current span while the block runs; it does not end with it."""
    if started is None:
        yield
        return
    from opentelemetry import trace

    with trace.use_span(started, end_on_exit=False):
        yield

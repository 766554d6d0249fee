"""One trace through every hop (docs/tracing.md): W3C ``traceparent`` taken from the client or started at
the worker, spans for the worker's route, preprocess, engine call and postprocess, and the context
passed on to Triton (gRPC metadata) and to vLLM (HTTP headers), whose own spans join the same trace.

- traceparent.py: the W3C header, parsed and checked (a malformed one is the client's 400);
- spans.py: the worker's tracer (OpenTelemetry's SDK, OTLP over HTTP), off unless a collector is named
  (``SERVING_TRACING_OTLP_ENDPOINT``), sampled (``SERVING_TRACING_SAMPLE``); every call is a no-op while
  it is off, so the request path pays nothing for it then.
"""

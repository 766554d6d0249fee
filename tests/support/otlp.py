"""An OTLP/HTTP trace receiver for the tests, made with OpenTelemetry's own protobuf definitions
(``opentelemetry-proto``): no OpenTelemetry Collector can be installed here (it is not on PyPI or in
Debian), so the tests receive spans with this instead, decoding what a collector decodes on
``POST /v1/traces``: ``ExportTraceServiceRequest`` as protobuf (the Python SDK, vLLM), optionally gzip,
or in OTLP's JSON encoding (Triton's C++ exporter sends that)."""
from __future__ import annotations

import gzip
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    attributes: dict


class Receiver:
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if "json" in (self.headers.get("Content-Type") or ""):
                    receiver._add_json(json.loads(body))  # OTLP/HTTP's JSON encoding (Triton's C++ exporter)
                else:
                    request = ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    receiver._add(request)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def _add(self, request: ExportTraceServiceRequest) -> None:
        found = []
        for resource in request.resource_spans:
            service = next((a.value.string_value for a in resource.resource.attributes if a.key == "service.name"), "")
            for scope in resource.scope_spans:
                for s in scope.spans:
                    attributes = {a.key: _value(a.value) for a in s.attributes}
                    found.append(Span(service, s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                      attributes))
        with self._lock:
            self.spans.extend(found)

    def _add_json(self, request: dict) -> None:
        """OTLP/JSON: as the protobuf, with ids as hex strings and attribute values as {"stringValue": ...}."""
        found = []
        for resource in request.get("resourceSpans") or ():
            attributes = {a["key"]: _json_value(a["value"]) for a in (resource.get("resource") or {}).get("attributes") or ()}
            for scope in resource.get("scopeSpans") or ():
                for s in scope.get("spans") or ():
                    found.append(Span(str(attributes.get("service.name", "")), s["name"], s["traceId"].lower(),
                                      s["spanId"].lower(), (s.get("parentSpanId") or "").lower(),
                                      {a["key"]: _json_value(a["value"]) for a in s.get("attributes") or ()}))
        with self._lock:
            self.spans.extend(found)

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _value(v) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


def _json_value(v: dict) -> object:
    for kind in ("stringValue", "boolValue", "doubleValue"):
        if kind in v:
            return v[kind]
    return int(v["intValue"]) if "intValue" in v else None


def children(spans: list[Span], parent: Span) -> Iterator[Span]:
    return (s for s in spans if s.parent_id == parent.span_id)

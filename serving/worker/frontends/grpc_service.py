"""The v2 protocol over gRPC (``inference.GRPCInferenceService``), so ``tritonclient.grpc`` works unchanged.

The service is the one generated in ``tritonclient.grpc.service_pb2_grpc``: no protocol of our own.
Every call goes to the data plane the HTTP front ends use, so routing (canary weights, the
``x-routing-key`` metadata, a pinned ``model_version``), shadows, statistics, client keys and
errors are the same; a :class:`ServingError` becomes the gRPC status a client can act on.
``ModelStatistics`` is Triton's statistics extension (version_stats.py). Calls a
worker has no use for (shared memory, repository load/unload, tracing) stay UNIMPLEMENTED.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, TypeVar

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from serving.tracing import spans, traceparent
from serving.worker import request_ids
from serving.worker.dataplane import DataPlane
from serving.worker.errors import ServingError, UnknownEndpoint
from serving.worker.frontends.grpc_codec import decode_infer_request, encode_infer_response
from serving.worker.frontends.serve_rest import parse_version
from serving.worker.frontends.v2_models import (
    SERVER_METADATA, check_model_ready, metadata_target, model_metadata, model_statistics, platform_backend,
)
from serving.worker.frontends.v2_text import infer_v2

log = logging.getLogger(__name__)
T = TypeVar("T")

ROUTING_KEY = "x-routing-key"  # X-Routing-Key, as gRPC metadata (lower case on the wire)
RETRY_AFTER = "retry-after"    # trailing metadata of UNAVAILABLE / RESOURCE_EXHAUSTED: seconds, as HTTP's header
CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
         403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
         413: grpc.StatusCode.RESOURCE_EXHAUSTED, 415: grpc.StatusCode.INVALID_ARGUMENT,
         422: grpc.StatusCode.INVALID_ARGUMENT, 429: grpc.StatusCode.RESOURCE_EXHAUSTED,
         502: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED}


def status_of(exc: ServingError) -> tuple[grpc.StatusCode, str, tuple[tuple[str, str], ...]]:
    """The gRPC code, message and trailing metadata of a worker error (retry hint included); an unknown
    model in Triton's words, as on v2 over HTTP."""
    if isinstance(exc, UnknownEndpoint):
        exc = exc.as_triton()
    retry = exc.headers.get("Retry-After")
    message = f"{exc.message} (retry after {retry} s)" if retry else exc.message
    return CODES.get(exc.status, grpc.StatusCode.INTERNAL), message, ((RETRY_AFTER, retry),) if retry else ()


async def _checked(given: str) -> None:
    traceparent.check(given)  # malformed: INVALID_ARGUMENT naming the metadata


def _metadata(context: grpc.aio.ServicerContext) -> dict[str, str]:
    return {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, dataplane: DataPlane) -> None:
        self.dataplane = dataplane

    async def _answer(self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[T]],
                      rpc: str = "inference.GRPCInferenceService") -> T:
        """Run one call under its request id (request_ids.py: the ``x-request-id`` metadata when usable, else a
        new one, sent back in the initial metadata); errors become statuses, never UNKNOWN with a traceback."""
        name, metadata = request_ids.HEADER.decode(), _metadata(context)
        with request_ids.serving(request_ids.choose(metadata.get(name))) as rid:
            await context.send_initial_metadata(((name, rid),))
            given = metadata.get(traceparent.HEADER)  # the client's trace, continued (serving/tracing/)
            if given is not None:
                await self._run(context, lambda: _checked(given))
            with spans.request_span(f"gRPC {rpc}", given, **{"serving.request_id": rid}):
                return await self._run(context, work)

    async def _run(self, context: grpc.aio.ServicerContext, work: Callable[[], Awaitable[T]]) -> T:
        try:
            return await work()
        except ServingError as exc:
            code, message, trailing = status_of(exc)
            await context.abort(code, message, trailing)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # a bug: one line to the client, the traceback to the log
            log.exception("unexpected error in a gRPC call")
            await context.abort(grpc.StatusCode.INTERNAL, f"internal error ({type(exc).__name__}); see the worker log")
        raise AssertionError("unreachable: abort raises")

    def _client(self, context: grpc.aio.ServicerContext, name: str) -> str | None:
        """The client key's name (``authorization: Bearer sk_...`` metadata), checked as on HTTP."""
        return self.dataplane.keys.check_authorization(_metadata(context).get("authorization"), name)

    # --- server ---------------------------------------------------------------------
    async def ServerLive(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerReadyResponse(ready=self.dataplane.config.current.loaded)

    async def ServerMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return service_pb2.ServerMetadataResponse(**SERVER_METADATA)

    # --- models ---------------------------------------------------------------------
    async def ModelReady(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            self._client(context, request.name)
            try:
                await check_model_ready(self.dataplane, request.name, request.version or None)
            except ServingError as exc:
                if exc.status != 503:
                    raise
                return service_pb2.ModelReadyResponse(ready=False)
            return service_pb2.ModelReadyResponse(ready=True)
        return await self._answer(context, work)

    async def ModelMetadata(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        async def work() -> Any:
            self._client(context, request.name)
            meta = model_metadata(self.dataplane, request.name, request.version or None)
            return service_pb2.ModelMetadataResponse(
                name=meta["name"], versions=meta["versions"], platform=meta["platform"],
                inputs=[service_pb2.ModelMetadataResponse.TensorMetadata(**t) for t in meta["inputs"]],
                outputs=[service_pb2.ModelMetadataResponse.TensorMetadata(**t) for t in meta["outputs"]])
        return await self._answer(context, work)

    async def ModelConfig(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Triton's model configuration, as much of it as an endpoint has: the platform and backend of the
        version answering, the tensors of its metadata, shapes as the signature gives them (max_batch_size
        0: the batch dimension is in the shape)."""
        async def work() -> Any:
            self._client(context, request.name)
            meta = model_metadata(self.dataplane, request.name, request.version or None)
            target = metadata_target(self.dataplane, request.name, request.version or None)
            plat, backend = platform_backend(self.dataplane.endpoint(request.name).engine, target)
            return service_pb2.ModelConfigResponse(config=model_config_pb2.ModelConfig(
                name=request.name, platform=plat, backend=backend, max_batch_size=0,
                input=[model_config_pb2.ModelInput(name=t["name"], data_type=_config_type(t["datatype"]),
                                                   dims=t["shape"]) for t in meta["inputs"]],
                output=[model_config_pb2.ModelOutput(name=t["name"], data_type=_config_type(t["datatype"]),
                                                     dims=t["shape"]) for t in meta["outputs"]]))
        return await self._answer(context, work)

    async def ModelStatistics(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Triton's statistics extension: the HTTP route's JSON, read into its protobuf (same names)."""
        async def work() -> Any:
            if request.name:
                self._client(context, request.name)
            stats = await model_statistics(self.dataplane, request.name or None, request.version or None)
            return json_format.ParseDict(stats, service_pb2.ModelStatisticsResponse())
        return await self._answer(context, work)

    async def RepositoryIndex(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Every endpoint's live versions and whether each is loaded in its engine."""
        async def work() -> Any:
            index = service_pb2.RepositoryIndexResponse()
            for name, ep in self.dataplane.config.current.endpoints.items():
                engine = self.dataplane.engines[ep.engine]
                for target in ep.targets:
                    ready = await engine.ready(target)
                    if ready or not request.ready:
                        index.models.add(name=name, version=str(target.version),
                                         state="READY" if ready else "UNAVAILABLE",
                                         reason="" if ready else "not loaded in its engine yet")
            return index
        return await self._answer(context, work)

    async def ModelInfer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        return await self._answer(context, lambda: self._infer(request, context), "ModelInfer")

    async def _infer(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        name = request.model_name
        client = self._client(context, name)
        version = parse_version(request.model_version) if request.model_version else None
        try:
            req = decode_infer_request(request)
        except ServingError as exc:
            self.dataplane.reject(name, exc.status, client)
            raise
        answer = infer_v2(self.dataplane, name, req, version, _metadata(context).get(ROUTING_KEY), client=client)
        remaining = context.time_remaining()
        if remaining is None:
            target, outputs = await answer
        else:
            work = asyncio.ensure_future(answer)
            done, _ = await asyncio.wait({work}, timeout=remaining)
            if not done:  # the answer is dropped; the data plane still records what the model did
                await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                    f"endpoint {name!r} did not answer within the call's deadline ({remaining:.3g} s)")
            target, outputs = work.result()
        return encode_infer_response(name, target.version, req, outputs)


def _config_type(datatype: str) -> int:
    return model_config_pb2.DataType.Value("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")


async def start_grpc_server(dataplane: DataPlane, host: str, port: int, max_message_bytes: int,
                            unix_name: str | None = None, max_connection_age_s: float = 0.0) -> grpc.aio.Server:
    """One server per worker process, on the process's event loop (the data plane's engines live
    there). ``so_reuseport``: every process binds the port itself and the kernel spreads new
    connections over them; with ``unix_name`` it listens on that abstract Unix socket instead, the
    manager handing it connections (serving/worker/handoff.py). ``max_connection_age_s``: a connection that
    old is told to go (GOAWAY; its calls under way get 30 s more), so clients reconnect and a Service spreads
    them over workers added since, as HTTP's ``Connection: close`` does (connection_age.py)."""
    options = [("grpc.so_reuseport", 1), ("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", -1)]
    if max_connection_age_s > 0:
        options += [("grpc.max_connection_age_ms", int(max_connection_age_s * 1000)),
                    ("grpc.max_connection_age_grace_ms", 30_000)]
    server = grpc.aio.server(options=options)
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(dataplane), server)
    address = f"unix-abstract:{unix_name}" if unix_name else f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as exc:
        raise RuntimeError(f"cannot listen for gRPC on {address}: {exc}") from None
    if not bound:
        raise RuntimeError(f"cannot listen for gRPC on {address}")
    await server.start()
    return server

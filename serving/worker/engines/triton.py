"""Forward tensors to NVIDIA Triton over gRPC (``tritonclient.grpc.aio``).

Which server runs a call is the ``channels`` object's business: one Triton over one reused
channel (serving/worker/engines/triton_channels.py, the ``host:port`` setting), or several,
spread and failed over (serving/worker/engines/triton_pool.py, ``dns:///name:port`` or a
``host:port,host:port`` list). A channel per request would cost a TCP and HTTP/2 handshake each
time; gRPC reconnects a channel by itself, so when Triton comes back requests succeed again
without a restart; meanwhile each failure is a 503 with ``Retry-After``.
"""
from __future__ import annotations

import asyncio
from typing import Any, Iterable, Mapping

import numpy as np
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import np_to_triton_dtype

from serving.tracing import spans
from serving.triton.loader_client import ColdLoadError, LoaderClient
from serving.triton.shapes import from_api, to_api
from serving.worker.batcher import MicroBatcher
from serving.worker.engines.triton_channels import DNS_PREFIX, OneTriton
from serving.worker.engines.triton_pool import TritonPool, addresses_source
from serving.worker.errors import ModelNotReady, Unavailable
from serving.worker.runtime import Target

COLD_TRIES = 3  # calls of a request whose model is cold under the memory budget (each after a load)


def channels_for(setting: str, resolve_period_s: float = 5.0) -> OneTriton | TritonPool:
    """``host:port``: one server (as always); ``dns:///name:port`` or ``h1:p1,h2:p2``: several."""
    setting = setting.strip()
    if setting.startswith(DNS_PREFIX) or "," in setting:
        return TritonPool(addresses_source(setting), resolve_period_s)
    return OneTriton(setting)


class TritonEngine:
    kind = "tensors"  # the data plane matches preprocess output to the model signature first

    def __init__(self, url: str | OneTriton | TritonPool, timeout_s: float = 30.0, batching: bool = True,
                 loader: LoaderClient | None = None) -> None:
        self.channels = channels_for(url) if isinstance(url, str) else url
        self.url = self.channels.url
        self.loader = loader  # the embedded Triton's load-on-demand endpoint (memory budget)
        self.timeout_s = timeout_s
        self.batching = batching  # merge concurrent requests in the worker (serving/worker/batcher.py)
        self._batchers: dict[str, MicroBatcher] = {}  # by Triton model name

    def prepare(self, target: Target) -> None:
        """Triton holds the models; nothing to load here."""

    def retain(self, targets: Iterable[Target]) -> None:
        keep = {t.triton_name for t in targets}
        self._batchers = {name: b for name, b in self._batchers.items() if name in keep}

    async def infer(self, target: Target, inputs: dict[str, np.ndarray],
                    pad: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
        rows = next(iter(inputs.values())).shape[0] if inputs and target.max_batch > 0 else 0
        if rows > target.max_batch:
            return await self._in_parts(target, inputs, pad, rows)
        if not self.batching or target.max_batch <= 1:
            return await self._call(target, inputs)
        batcher = self._batchers.get(target.triton_name)
        if batcher is None:
            batcher = self._batchers[target.triton_name] = MicroBatcher(lambda merged: self._call(target, merged),
                                                            target.max_batch, target.outputs)
        return await batcher.submit(inputs, pad)

    async def _in_parts(self, target: Target, inputs: dict[str, np.ndarray], pad: Mapping[str, int] | None,
                        rows: int) -> dict[str, np.ndarray]:
        """A request larger than the model's max_batch_size (Triton refuses those) goes as several
        calls of at most that many rows, run side by side, their outputs joined in order."""
        step = target.max_batch
        parts = await asyncio.gather(*(self.infer(target, {k: v[i:i + step] for k, v in inputs.items()}, pad)
                                       for i in range(0, rows, step)))
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    async def _call(self, target: Target, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One Triton call. A model cold under the embedded Triton's memory budget is loaded on
        demand (the request waits for the load) and the call made again: the model may be unloaded
        once more between the load and the call when the budget is tight, hence a few tries."""
        for attempt in range(COLD_TRIES):
            try:
                return await self._call_once(target, inputs)
            except ModelNotReady:
                if attempt + 1 == COLD_TRIES or not await self._load_cold(target):
                    raise
        raise AssertionError("unreachable")

    async def _load_cold(self, target: Target) -> bool:
        """True once the loader has the model loaded; False when it knows no such model (no
        budget: the model is simply not loaded yet)."""
        if self.loader is None:
            return False
        try:
            return await self.loader.ensure(target.triton_name, self.timeout_s)
        except ColdLoadError as exc:
            raise Unavailable(f"model {target.triton_name} is cold and could not be loaded now: {exc}",
                              retry_after_s=int(exc.retry_after_s or 1)) from None

    async def _call_once(self, target: Target, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        tensors = []
        for name, array in to_api(inputs, target.padded).items():
            tensor = InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        outputs = [InferRequestedOutput(n) for n in target.output_names]
        trace = spans.headers()  # gRPC metadata: Triton's OpenTelemetry spans join the trace (docs/tracing.md)
        result = await self.channels.run(target.triton_name, lambda client: client.infer(
            target.triton_name, tensors, outputs=outputs or None, client_timeout=self.timeout_s,
            headers=trace or None))
        names = target.output_names or [o.name for o in result.get_response().outputs]
        return from_api({n: result.as_numpy(n) for n in names}, target.padded)

    async def ready(self, target: Target) -> bool:
        if await self.channels.model_ready(target.triton_name):
            return True
        return self.loader is not None and await self.loader.aloadable(target.triton_name)  # cold: loads on demand

    def is_ready(self, target: Target) -> bool:
        """Readiness gate (serving/worker/gate.py): has Triton loaded this model? Called from the
        config thread, so a blocking client of its own; unreachable counts as not ready."""
        if self.channels.model_ready_sync(target.triton_name):
            return True
        # cold under the embedded Triton's memory budget: loaded on demand, so ready to take traffic
        return self.loader is not None and self.loader.loadable(target.triton_name)

    async def close(self) -> None:
        if self.loader is not None:
            await self.loader.close()
        await self.channels.close()


def create(settings: Any, artifact_path: Any) -> TritonEngine:
    from serving.credentials import worker_token

    url = settings.triton_loader_url
    loader = LoaderClient(url, lambda: worker_token(settings)) if url else None
    channels = channels_for(settings.triton_grpc_url, settings.triton_resolve_period_s)
    return TritonEngine(channels, settings.infer_timeout_s, settings.worker_batching, loader)

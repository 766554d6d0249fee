"""Forward tensors to NVIDIA Triton over gRPC (``tritonclient.grpc.aio``).

One client (one HTTP/2 channel) per worker process, created inside the process's
event loop on first use and reused by every request: a channel per request would
cost a TCP and HTTP/2 handshake each time. gRPC reconnects the channel by itself,
so when Triton comes back requests succeed again without a restart; meanwhile
each failure is a 503 with ``Retry-After``.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Iterable, Mapping

import numpy as np
import tritonclient.grpc.aio as grpc_aio
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from serving.triton.loader_client import ColdLoadError, LoaderClient
from serving.triton.shapes import from_api, to_api
from serving.worker.batcher import MicroBatcher
from serving.worker.errors import BadGateway, BadRequest, ModelNotReady, Unavailable, brief
from serving.worker.runtime import Target

_MODEL_MISSING = ("unknown model", "is not ready", "not found", "no version is available")
COLD_TRIES = 3  # calls of a request whose model is cold under the memory budget (each after a load)
_UNREACHABLE = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED", "failed to connect", "Socket closed")


def classify(exc: InferenceServerException, url: str, model: str) -> Exception:
    status, message = str(exc.status() or ""), str(exc.message() or exc)
    if any(s in message for s in _MODEL_MISSING):
        return ModelNotReady(f"model {model} is not loaded in Triton yet")
    if any(s in status or s in message for s in _UNREACHABLE):
        return Unavailable(f"Triton at {url} is unreachable ({status or message})")
    if "INVALID_ARGUMENT" in status:
        return BadRequest(f"Triton rejected the request for {model}: {brief(message)}")
    return BadGateway(f"Triton failed on {model}: {brief(message)}")


class TritonEngine:
    kind = "tensors"  # the data plane matches preprocess output to the model signature first

    def __init__(self, url: str, timeout_s: float = 30.0, batching: bool = True,
                 loader: LoaderClient | None = None) -> None:
        self.url = url
        self.loader = loader  # the embedded Triton's load-on-demand endpoint (memory budget)
        self.timeout_s = timeout_s
        self.batching = batching  # merge concurrent requests in the worker (serving/worker/batcher.py)
        self._client: grpc_aio.InferenceServerClient | None = None
        self._sync_client: Any = None  # readiness checks from the config thread (no event loop there)
        self._sync_lock = threading.Lock()
        self._batchers: dict[str, MicroBatcher] = {}  # by Triton model name

    def client(self) -> grpc_aio.InferenceServerClient:
        if self._client is None:
            self._client = grpc_aio.InferenceServerClient(self.url)
        return self._client

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
        try:
            result = await self.client().infer(target.triton_name, tensors, outputs=outputs or None,
                                               client_timeout=self.timeout_s)
        except InferenceServerException as exc:
            raise classify(exc, self.url, target.triton_name) from None
        except (OSError, asyncio.TimeoutError) as exc:
            raise Unavailable(f"Triton at {self.url} is unreachable ({exc})") from None
        names = target.output_names or [o.name for o in result.get_response().outputs]
        return from_api({n: result.as_numpy(n) for n in names}, target.padded)

    async def ready(self, target: Target) -> bool:
        try:
            if await self.client().is_model_ready(target.triton_name, client_timeout=2.0):
                return True
        except Exception:
            return False
        return self.loader is not None and await self.loader.aloadable(target.triton_name)  # cold: loads on demand

    def is_ready(self, target: Target) -> bool:
        """Readiness gate (serving/worker/gate.py): has Triton loaded this model? Called from the
        config thread, so a blocking client of its own; unreachable counts as not ready."""
        import tritonclient.grpc as grpc_sync

        with self._sync_lock:
            if self._sync_client is None:
                self._sync_client = grpc_sync.InferenceServerClient(self.url)
            client = self._sync_client
        try:
            if client.is_model_ready(target.triton_name, client_timeout=2.0):
                return True
        except Exception:
            return False
        # cold under the embedded Triton's memory budget: loaded on demand, so ready to take traffic
        return self.loader is not None and self.loader.loadable(target.triton_name)

    async def close(self) -> None:
        if self.loader is not None:
            await self.loader.close()
        if self._client is not None:
            await self._client.close()
            self._client = None


def create(settings: Any, artifact_path: Any) -> TritonEngine:
    from serving.credentials import worker_token

    url = settings.triton_loader_url
    loader = LoaderClient(url, lambda: worker_token(settings)) if url else None
    return TritonEngine(settings.triton_grpc_url, settings.infer_timeout_s, settings.worker_batching, loader)

"""gRPC requests count in the statistics as HTTP ones do, and feed shadows: the worker in-process
(to read its recorder), its gRPC server on a real socket, NVIDIA's aio client."""
from __future__ import annotations

import asyncio

import numpy as np
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from tests.serving.worker.grpc_worker import tensor_inputs
from tests.serving.worker.test_shadow import second_model, shadow_spec, wait_events  # noqa: F401 (fixture)
from tests.serving.worker.test_v2 import tokens
from tests.support.procs import free_port


async def calls(dataplane, feeds: dict[str, np.ndarray], recorder) -> list[str]:
    from serving.worker.frontends.grpc_service import start_grpc_server

    port = free_port()
    server = await start_grpc_server(dataplane, "127.0.0.1", port, 1 << 20)
    codes = []
    try:
        async with aioclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
            for _ in range(4):
                await client.infer("clf", tensor_inputs(aioclient, feeds))
            for bad in ({"input_ids": feeds["input_ids"]}, feeds):
                try:
                    await client.infer("clf" if len(bad) == 1 else "nope", tensor_inputs(aioclient, bad))
                except InferenceServerException as exc:
                    codes.append(exc.status())
        for _ in range(600):  # the shadow copies run on this loop, after the answers: let them finish
            if sum("shadow" in e for e in recorder.events) >= 4:
                break
            await asyncio.sleep(0.05)
    finally:
        await server.stop(0)
    return codes


def test_grpc_requests_are_recorded_and_copied_to_shadows(make_client, clf_spec, store, tiny_model, second_model):
    client, recorder = make_client(shadow_spec(clf_spec, store, second_model, 100.0))
    codes = asyncio.run(calls(client.app.state.dataplane, tokens(tiny_model), recorder))
    assert codes == ["StatusCode.INVALID_ARGUMENT", "StatusCode.NOT_FOUND"]
    shadows = wait_events(recorder, 4)
    live = [e for e in recorder.events if "shadow" not in e]
    # 4 answers and the refused bad request, as on HTTP; the unknown endpoint has no label to count
    assert sorted(e["status"] for e in live) == [200, 200, 200, 200, 400]
    assert all(e["endpoint"] == "clf" and e["version"] == 1 for e in live if e["status"] == 200)
    assert all(e["version"] == 2 and e["shadow"]["live_version"] == 1 for e in shadows)


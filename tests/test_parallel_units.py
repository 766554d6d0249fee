"""The suite's split over xdist processes names real files: a renamed module would silently leave
the host-network group (and run beside a cluster) or lose its early start."""
from __future__ import annotations

from pathlib import Path

from tests.support.parallel import HOST_NETWORK, HOST_NETWORK_PATHS, LONG_MODULES, VLLM_ENGINE_PATHS, rank, unit_of

REPO = Path(__file__).resolve().parents[1]
# modules that name the vLLM venv without starting an engine from it
NO_ENGINE = {"tests/test_setup_bytecode.py"}  # reads its bytecode files


def test_every_named_path_exists():
    for path in (*HOST_NETWORK_PATHS, *VLLM_ENGINE_PATHS, *LONG_MODULES):
        assert (REPO / path).exists(), path


def test_cluster_compose_and_browser_tests_share_one_unit_and_start_first():
    ids = ["tests/deploy/kube/test_operations.py::test_x", "tests/deploy/test_compose_up.py::test_y",
           "tests/registry/console/test_console_browser.py::test_z[audit]"]
    assert {unit_of(i) for i in ids} == {HOST_NETWORK}
    assert unit_of("tests/deploy/test_compose.py::test_a") == "tests/deploy/test_compose.py"
    assert rank(ids[0]) < rank("tests/serving/triton/test_budget.py::test_b") < rank("tests/registry/test_api.py::test_c")


def test_the_modules_that_start_vllm_engines_start_first_each_a_unit_of_its_own():
    """Every test module naming the vLLM venv (an engine of its own) is listed to start early, or is in
    the host-network unit (the console's chat test)."""
    starting = {str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                if ".venv-vllm" in p.read_text() and p.name != Path(__file__).name}
    assert starting, "no module names the vLLM venv: the check looks for the wrong thing"
    assert NO_ENGINE <= starting, "a module listed as naming the vLLM venv no longer does"
    for path in starting - NO_ENGINE:
        assert path in VLLM_ENGINE_PATHS or unit_of(f"{path}::t") == HOST_NETWORK, path
    assert {unit_of(f"{p}::t") for p in VLLM_ENGINE_PATHS} == set(VLLM_ENGINE_PATHS)
    host, first, last = (rank(f"{p}::t") for p in ("tests/deploy/kube/test_cluster.py", VLLM_ENGINE_PATHS[0],
                                                    VLLM_ENGINE_PATHS[-1]))
    assert host < first < last < rank(f"{LONG_MODULES[0]}::t") < rank("tests/registry/test_api.py::t")
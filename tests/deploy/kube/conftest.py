"""The real single-node Kubernetes these tests install into (tests/support/kube/cluster.py).

Where it cannot be had (not root, scripts/kube-build.sh not run, a tool missing), the tests cannot
run: in CI that fails naming what is missing, elsewhere they are skipped with it.
"""
from __future__ import annotations

import pytest

from tests.support.ci import cannot_run
from tests.support.kube import tools
from tests.support.kube.cluster import Cluster, new_cluster


def start_cluster() -> Cluster:
    why = tools.missing()
    if why:
        cannot_run(f"no Kubernetes cluster here: {why}")
    cluster = new_cluster()
    try:
        cluster.start()
    except BaseException as exc:
        tails = cluster.tails()
        left = cluster.stop()
        pytest.fail(f"the test cluster did not start: {exc}\n{tails}\nleft after stopping it: {left}", pytrace=False)
    return cluster


def stop_cluster(cluster: Cluster) -> None:
    left = cluster.stop()
    print(f"\nkube test cluster timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in cluster.timings.items()))
    if left:
        pytest.fail("the test cluster left these behind:\n" + "\n".join(left), pytrace=False)


@pytest.fixture(scope="module")
def kube_cluster():
    """A cluster for the module: started on first use, stopped (and checked to leave nothing) at its end."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)

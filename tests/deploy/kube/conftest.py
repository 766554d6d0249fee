"""The real single-node Kubernetes these tests install into (tests/support/kube/cluster.py).

Where it cannot be had (not root, scripts/kube-build.sh not run, a tool missing), the tests cannot
run: in CI that fails naming what is missing, elsewhere they are skipped with it.
"""
from __future__ import annotations

import pytest

from tests.deploy.kube.helm_release import images_in_node
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
    print("\nkube test cluster timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in cluster.timings.items()))
    if left:
        pytest.fail("the test cluster left these behind:\n" + "\n".join(left), pytrace=False)


# test_cluster.py starts and stops a cluster of its own, and a machine holds one at a time: it must run before
# any module that uses this package's shared cluster, which lives until the package's last test. Modules run in
# name order, so such a module's name sorts after test_cluster.py (a test_autoscaling.py ran first and the
# cluster test could not start: CI 2026-11-28).
@pytest.fixture(scope="package")
def kube_cluster():
    """One cluster for the install and the operations tests (each installs and removes its own release, and
    deletes its namespace): started on first use, stopped (and checked to leave nothing) after the last."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        stop_cluster(cluster)


@pytest.fixture(scope="package")
def platform_images_in_node(kube_cluster):
    """The platform's images, built once for the cluster and imported into its node."""
    with images_in_node(kube_cluster) as names:
        yield names

"""On the real cluster, the workers scale on their requests in flight with the stock HorizontalPodAutoscaler.

One install with ``metricsApi.enabled`` (the control plane serves ``external.metrics.k8s.io/v1beta1``
through the API server's aggregation layer, registry/autoscaling/) and the workers' HPA on
``serving_worker_requests_in_flight`` (4 a replica, 1 to 4 replicas, behavior from the values), the
holding endpoint of autoscaling_load.py behind it.

A step load of closed-loop clients through the workers' Service (2, then 16, then 2) with the
replicas, the metric and the latencies sampled every second: the HPA scales the workers up within a
stated time and back down after, and no request is lost or answered wrong. The figures are printed.
"""
from __future__ import annotations

import time

import pytest

from tests.deploy.kube.autoscaling_load import (
    METRIC, Clients, Sample, Watch, autoscaling_values, deploy_hold, external_metric, percentile_ms, ready_workers,
)
from tests.deploy.kube.helm_release import installed
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(1800)

PER_REPLICA, MOST = 4, 4
UP_WITHIN_S, DOWN_WITHIN_S = 90, 150  # the HPA syncs every 5 s here (tests/support/kube/cluster.py)


@pytest.fixture(scope="module")
def release(kube_cluster, platform_images_in_node, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("autoscaling")
    with installed(kube_cluster, platform_images_in_node, tmp, autoscaling_values(PER_REPLICA, MOST)) as rel:
        deploy_hold(rel, tmp)
        yield rel


def test_the_external_metrics_api_is_available_through_the_aggregation_layer(release):
    def available() -> bool:
        service = release.cluster.get("apiservice", "v1beta1.external.metrics.k8s.io")
        return any(c["type"] == "Available" and c["status"] == "True" for c in service["status"].get("conditions", []))
    wait_until(available, 120, "the APIService Available", interval=1,
               on_timeout=lambda: release.cluster.kubectl("get", "apiservice", "v1beta1.external.metrics.k8s.io",
                                                          "-o", "yaml", check=False).stdout + release.describe())
    assert wait_until(lambda: external_metric(release) is not None, 60, "a value of the metric") is not None
    # nothing in flight, once the signal's 10 s window has passed the requests deploy_hold sent until the endpoint
    # answered (a CI run read 0.25: one of the window's samples caught one of them); a request whose life never
    # ended would keep it above 0
    seen: list[float | None] = []
    wait_until(lambda: seen.append(external_metric(release)) or seen[-1] == 0.0, 30, "nothing in flight",
               interval=1, on_timeout=lambda: f"read {seen}")
    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/default/{METRIC}"
    other = release.cluster.kubectl("get", "--raw", path, check=False)
    assert other.returncode != 0 and "is served for namespace" in other.stderr, other.stderr


def test_the_workers_scale_up_on_requests_in_flight_and_back_down(release):
    clients = Clients(release).start(16)
    phases: dict[str, tuple[float, float]] = {}  # (start, end), monotonic
    try:
        with Watch(release, clients) as watch:
            clients.count = 2
            start = time.monotonic()
            time.sleep(30)
            assert ready_workers(release) == 1, "2 clients (2 in flight, 4 a replica) need one worker"
            phases["2 clients"] = (start, time.monotonic())
            clients.count = 16
            start = time.monotonic()
            wait_until(lambda: ready_workers(release) == MOST, UP_WITHIN_S, f"{MOST} ready workers under 16 clients",
                       interval=1, on_timeout=release.describe)
            up_s = time.monotonic() - start
            phases["16 clients, scaling up"] = (start, time.monotonic())
            start = time.monotonic()
            time.sleep(25)  # the scale-up landed; connections older than 5 s are closed: the clients spread
            phases["16 clients, scaled"] = (start, time.monotonic())
            clients.count = 2
            start = time.monotonic()
            wait_until(lambda: ready_workers(release) == 1 and len(release.pods("worker")) == 1, DOWN_WITHIN_S,
                       "back to one worker under 2 clients", interval=1, on_timeout=release.describe)
            down_s = time.monotonic() - start
            time.sleep(10)
            phases["2 clients again"] = (start, time.monotonic())
    finally:
        clients.stop()
    print_figures(watch.samples, clients.results, phases, up_s, down_s)
    outcomes = [o for _, _, o in clients.results]
    assert outcomes.count("ok") == len(outcomes), [o for o in outcomes if o != "ok"][:10]
    assert max(s.desired for s in watch.samples) == MOST
    start, end = phases["16 clients, scaled"]
    late = [pod for t, pod in clients.pods if start + 10 <= t <= end]  # 10 s on: every connection is a new one
    shares = {pod: late.count(pod) / len(late) for pod in set(late)}
    print(f"answers by pod, the last 15 s at 16 clients: {', '.join(f'{p[-5:]} {v:.0%}' for p, v in sorted(shares.items()))}")
    assert len(shares) == MOST and min(shares.values()) >= 0.05, shares  # the new workers take a share


def print_figures(samples: list[Sample], results: list[tuple[float, float, str]],
                  phases: dict[str, tuple[float, float]], up_s: float, down_s: float) -> None:
    t0 = samples[0].t if samples else 0.0
    lines = [f"\nworkers' HPA on requests in flight ({PER_REPLICA} a replica), sampled each second:",
             "  t (s)  clients  metric  desired  ready"]
    shown: tuple = ()
    for s in samples:
        row = (s.clients, s.desired, s.ready)
        if row != shown or int(s.t - t0) % 10 == 0:
            metric = "-" if s.metric is None else f"{s.metric:.1f}"
            lines.append(f"  {s.t - t0:5.0f}  {s.clients:7d}  {metric:>6}  {s.desired:7d}  {s.ready:5d}")
            shown = row
    lines.append(f"scale-up to {MOST} ready workers {up_s:.0f} s after 16 clients started; back to 1 {down_s:.0f} s "
                 "after the load fell to 2 clients")
    for name, (start, end) in phases.items():
        within = [lat for t, lat, _ in results if start <= t <= end]
        lines.append(f"  {name:24s} {len(within):5d} requests, p50 {percentile_ms(within, 50):5.0f} ms, "
                     f"p99 {percentile_ms(within, 99):5.0f} ms")
    outcomes = [o for _, _, o in results]
    lines.append(f"requests: {len(outcomes)} sent, {outcomes.count('ok')} answered right, "
                 f"{len(outcomes) - outcomes.count('ok')} lost or wrong")
    print("\n".join(lines))

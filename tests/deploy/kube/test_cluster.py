"""The test cluster itself: pods run, Services get ClusterIPs, the cluster-DNS stand-in answers Service
names, and stopping the cluster leaves nothing on the host.

It runs a pod of the cluster's own pause image only (no platform image needed), with what makes
kubelet, containerd and the CNI plugins touch the host: a Secret volume and a memory emptyDir
(tmpfs mounts), a hostPort (the portmap plugin's iptables chains), a ClusterIP Service and a
headless one (kube-proxy's chains, the DNS stand-in's two kinds of answer).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from dnslib import QTYPE, RCODE, DNSRecord

from tests.deploy.kube.conftest import start_cluster
from tests.support.kube import host_state
from tests.support.kube.cluster import DNS_SERVICE_IP, PAUSE_IMAGE, POD_CIDR, SERVICE_CIDR
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(600)

NS = "teardown-check"
CONTAINER_CGROUP = Path("/sys/fs/cgroup/pids/k8s.io/killed-cluster-test")  # as containerd's CRI names them


def manifests(host_port: int) -> str:
    return f"""apiVersion: v1
kind: Namespace
metadata: {{name: {NS}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: token, namespace: {NS}}}
stringData: {{token: not-a-secret}}
---
apiVersion: v1
kind: Pod
metadata: {{name: sleeper, namespace: {NS}, labels: {{app: sleeper}}}}
spec:
  hostname: sleeper
  subdomain: sleepers
  containers:
  - name: pause
    image: {PAUSE_IMAGE}
    imagePullPolicy: Never
    ports: [{{name: web, containerPort: 8080, hostPort: {host_port}}}]
    volumeMounts:
    - {{name: secret, mountPath: /secret}}
    - {{name: scratch, mountPath: /scratch}}
  volumes:
  - {{name: secret, secret: {{secretName: token}}}}
  - {{name: scratch, emptyDir: {{medium: Memory}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: sleeper, namespace: {NS}}}
spec:
  selector: {{app: sleeper}}
  ports: [{{port: 80, targetPort: web}}]
---
apiVersion: v1
kind: Service
metadata: {{name: sleepers, namespace: {NS}}}
spec:
  clusterIP: None
  selector: {{app: sleeper}}
  ports: [{{port: 8080, targetPort: web}}]
"""


def ask(cluster, name: str) -> DNSRecord:
    """One A query to the DNS stand-in (on the node, where the kube-dns Service sends pods' queries)."""
    reply = DNSRecord.question(name, "A").send(cluster.ip, cluster.ports["dns"], timeout=5)
    return DNSRecord.parse(reply)


def a_records(record: DNSRecord) -> list[str]:
    return sorted(str(rr.rdata) for rr in record.rr if rr.rtype == QTYPE.A)


def leave_a_killed_clusters_remains() -> dict[str, object]:
    """What a cluster whose test run was killed leaves (no teardown ran): its directory with a process
    naming it, a container's process (reparented to init, in its container's cgroup), its bridge holding the
    route to the pod range, a kube-proxy chain, a pod's netns."""
    root = Path(tempfile.mkdtemp(prefix=host_state.CLUSTER_DIR_PREFIX))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(root)])
    container = subprocess.Popen(["sleep", "600"])
    CONTAINER_CGROUP.mkdir(parents=True, exist_ok=True)
    (CONTAINER_CGROUP / "cgroup.procs").write_text(str(container.pid))
    bridge = f"skube{(os.getpid() + 1) % 100000}"  # never the next cluster's own name (its pid's)
    for cmd in (["ip", "link", "add", bridge, "type", "bridge"], ["ip", "addr", "add", "10.213.0.1/24", "dev", bridge],
                ["ip", "link", "set", bridge, "up"], ["iptables", "-w", "-N", "KUBE-KILLED-CLUSTER"],
                ["iptables", "-w", "-A", "FORWARD", "-d", POD_CIDR, "-j", "KUBE-KILLED-CLUSTER"],
                ["ip", "netns", "add", "cni-killed-cluster"]):
        subprocess.run(cmd, check=True, capture_output=True)
    return {"root": root, "proc": proc, "container": container, "bridge": bridge}


def route_device(ip: str) -> str:
    words = subprocess.run(["ip", "route", "get", ip], capture_output=True, text=True, check=True).stdout.split()
    return words[words.index("dev") + 1]


def test_pods_run_services_resolve_and_stopping_leaves_nothing():
    dead = leave_a_killed_clusters_remains()
    cluster = start_cluster()
    stopped = False
    try:
        # the start removed the killed cluster's remains: its bridge took the pod range's route (a CI run's
        # pods were all unreachable from the host after a killed run), its process, chain and netns
        assert dead["proc"].wait(10) is not None and dead["container"].wait(10) is not None
        assert not host_state.link_exists(dead["bridge"]) and not dead["root"].exists()
        assert "KUBE-KILLED-CLUSTER" not in host_state._iptables_save()
        assert "cni-killed-cluster" not in host_state._netns()
        assert f"bridge {dead['bridge']}" in cluster.cleared and f"directory {dead['root']}" in cluster.cleared
        cluster.apply(manifests(free_port()))
        wait_until(lambda: cluster.get("pod", "sleeper", "-n", NS)["status"].get("phase") == "Running", 120,
                   "the pod Running", interval=0.5, on_timeout=cluster.tails)
        pod_ip = cluster.get("pod", "sleeper", "-n", NS)["status"]["podIP"]
        assert pod_ip.startswith(POD_CIDR.rsplit(".", 1)[0] + "."), pod_ip
        assert route_device(pod_ip) == cluster.bridge  # the host (kubelet's probes) reaches pods on this bridge
        cluster_ip = cluster.get("service", "sleeper", "-n", NS)["spec"]["clusterIP"]
        assert cluster_ip.startswith(SERVICE_CIDR.rsplit(".", 1)[0] + ".")
        assert a_records(ask(cluster, f"sleeper.{NS}.svc.cluster.local")) == [cluster_ip]
        wait_until(lambda: a_records(ask(cluster, f"sleepers.{NS}.svc.cluster.local")) == [pod_ip], 30,
                   "the headless Service's name answering the pod's IP")
        assert a_records(ask(cluster, f"sleeper.sleepers.{NS}.svc.cluster.local")) == [pod_ip]
        assert ask(cluster, f"nothing.{NS}.svc.cluster.local").header.rcode == RCODE.NXDOMAIN
        assert ask(cluster, "pypi.org").header.rcode == RCODE.NXDOMAIN
        # kube-proxy programs the Services: pods' resolver address is kube-dns's ClusterIP
        assert cluster.get("service", "kube-dns", "-n", "kube-system")["spec"]["clusterIP"] == DNS_SERVICE_IP
        assert "KUBE-SERVICES" in host_state._iptables_save()
        assert host_state.mounts_under(cluster.root / "kubelet" / "pods"), "no volume mounts: the test checks nothing"
        assert host_state.new_netns(cluster.baseline)
        with socket.create_connection((cluster.ip, cluster.ports["apiserver"]), timeout=5):
            pass
        root = cluster.root
        left = cluster.stop()
        stopped = True
        assert left == [], left
        assert cluster.forced == [], f"the graceful stop left these, removed by force: {cluster.forced}"
        assert not root.exists()
    finally:
        if not stopped:
            cluster.stop()
        dead["proc"].kill()
        dead["container"].kill()
        dead["container"].wait(10)
        CONTAINER_CGROUP.rmdir()
        if host_state.link_exists(dead["bridge"]):
            subprocess.run(["ip", "link", "delete", dead["bridge"]], capture_output=True)
        shutil.rmtree(dead["root"], ignore_errors=True)

"""A real single-node Kubernetes v1.20.2 for the tests, started from the binaries scripts/kube-build.sh caches.

Control plane: etcd, kube-apiserver (TLS from a CA made with openssl, pki.py), kube-controller-manager,
kube-scheduler. Node: containerd (its own config, root, state and socket in the cluster's temporary
directory), kubelet, kube-proxy (iptables mode: Services' ClusterIPs), a CNI bridge network
(bridge + host-local + portmap) and a cluster-DNS stand-in for CoreDNS (cluster_dns.py) behind a
``kube-dns`` Service, which kubelet names to pods as their name server.

Everything the cluster creates on the host is named after it (host_state.py) so that ``stop()`` can
check that nothing is left: the graceful path deletes every pod and waits for kubelet and containerd
to take down their sandboxes, mounts and network namespaces; then the processes stop, kube-proxy
cleans its iptables chains, and whatever is still there is named and removed.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.kube import host_state, images, tools
from tests.support.kube.images import PAUSE_IMAGE
from tests.support.kube.pki import Pki, kubeconfig, make_pki
from tests.support.procs import REPO, free_port, wait_until

POD_CIDR = "10.213.0.0/24"
SERVICE_CIDR = "10.214.0.0/24"
API_SERVICE_IP = "10.214.0.1"
DNS_SERVICE_IP = "10.214.0.10"
NODE = "serving-test-node"


def node_ip() -> str:
    """The host's address on its default route: the node's InternalIP, where pods reach the host."""
    out = subprocess.run(["ip", "-4", "-j", "route", "get", "192.0.2.123"], capture_output=True, text=True)
    try:
        return json.loads(out.stdout)[0]["prefsrc"]
    except (ValueError, IndexError, KeyError):
        addrs = json.loads(subprocess.run(["ip", "-4", "-j", "addr"], capture_output=True, text=True).stdout)
        return next(a["local"] for i in addrs for a in i["addr_info"] if not a["local"].startswith("127."))


@dataclass
class Cluster:
    root: Path
    ip: str
    bridge: str
    node: str = NODE
    pki: Pki | None = None
    kubeconfig: Path | None = None
    api_url: str = ""
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    baseline: host_state.Snapshot | None = None
    forced: list[str] = field(default_factory=list)  # what stop() had to remove by force
    cleared: list[str] = field(default_factory=list)  # what killed clusters had left, removed by start()
    undone: list[str] = field(default_factory=list)  # host changes no component undoes, undone by stop()
    timings: dict[str, float] = field(default_factory=dict)
    _store_lock: Any = None

    # --- paths and commands ---------------------------------------------------------------

    @property
    def containerd_sock(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def tail(self, name: str, lines: int = 30) -> str:
        try:
            return f"--- {name}\n" + "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return f"--- {name}: no log"

    def tails(self) -> str:
        return "\n".join(self.tail(n) for n in self.procs)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess:
        out = subprocess.run([tools.exe("kubectl"), f"--kubeconfig={self.kubeconfig}", *args], input=input,
                             capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {out.stderr.strip()[-2000:]}")
        return out

    def apply(self, manifest: str) -> None:
        self.kubectl("apply", "-f", "-", input=manifest)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([tools.exe("ctr"), "--address", str(self.containerd_sock), "-n", "k8s.io", *args],
                              capture_output=True, text=True, timeout=timeout, env=self._env())

    def _env(self) -> dict[str, str]:
        return {**os.environ, "PATH": tools.path_env()}

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log(name), "ab") as out:
            proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self._env(), cwd=REPO)
        self.procs[name] = proc
        return proc

    def _wait(self, what: str, check, timeout: float = 60) -> None:
        def ok():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n"
                                   + "\n".join(self.tail(n) for n in dead))
            return check()
        wait_until(ok, timeout, what, interval=0.3, on_timeout=self.tails)

    # --- start ----------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        tools.IMAGE_STORE.mkdir(parents=True, exist_ok=True)
        self._store_lock = open(tools.CACHE / "containerd-root.lock", "w")
        try:  # containerd's root is shared across sessions, not between two clusters at once
            fcntl.flock(self._store_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another test cluster is using {tools.IMAGE_STORE} (one at a time)") from None
        self.cleared = host_state.clear_dead_clusters(self.root, POD_CIDR, SERVICE_CIDR)
        if self.cleared:
            print(f"removed what {len(self.cleared)} leftovers of killed test clusters held:", *self.cleared[:20],
                  sep="\n  ", file=sys.stderr)
        self.baseline = host_state.snapshot()
        if host_state.link_exists(self.bridge):
            raise RuntimeError(f"a bridge named {self.bridge} already exists: another cluster is running here?")
        for name in ("etcd", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kubelet",
                     "kube-proxy-metrics", "kube-proxy-healthz", "dns"):
            self.ports[name] = free_port()
        self.pki = make_pki(self.root / "pki", self.ip, API_SERVICE_IP)
        self.api_url = f"https://{self.ip}:{self.ports['apiserver']}"
        self.kubeconfig = kubeconfig(self.pki, self.api_url, self.root / "kubeconfig")
        self._start_control_plane()
        self.timings["control plane"] = time.monotonic() - t0
        self._start_node()
        self.timings["node ready"] = time.monotonic() - t0

    def _start_control_plane(self) -> None:
        p, pki = self.ports, self.pki
        assert pki is not None
        self._start("etcd", [tools.exe("etcd"), "--name=default", f"--data-dir={self.root / 'etcd'}",
                             f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
                             f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
                             f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                             f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                             f"--initial-cluster=default=http://127.0.0.1:{p['etcd-peer']}",
                             "--logger=zap", "--log-level=warn"])
        self._start("kube-apiserver", [
            tools.exe("kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
            f"--bind-address={self.ip}", f"--advertise-address={self.ip}", f"--secure-port={p['apiserver']}",
            "--insecure-port=0", f"--tls-cert-file={pki.server_cert}", f"--tls-private-key-file={pki.server_key}",
            f"--client-ca-file={pki.ca}", f"--service-account-key-file={pki.sa_pub}",
            f"--service-account-signing-key-file={pki.sa_key}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--authorization-mode=Node,RBAC",
            f"--kubelet-client-certificate={pki.client_cert}", f"--kubelet-client-key={pki.client_key}",
            "--kubelet-preferred-address-types=InternalIP", "--allow-privileged=true", "--profiling=false",
            f"--cert-dir={self.root / 'apiserver-certs'}",
            # the aggregation layer (an APIService served by a pod, e.g. the control plane's external metrics):
            # the API server proxies to the pod's address as kubeadm's clusters do, with a client certificate
            f"--requestheader-client-ca-file={pki.front_proxy_ca}", "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-", f"--proxy-client-cert-file={pki.front_proxy_cert}",
            f"--proxy-client-key-file={pki.front_proxy_key}", "--enable-aggregator-routing=true", "--v=1"])
        self._wait("the API server's /readyz", lambda: self.kubectl("get", "--raw=/readyz", check=False).returncode == 0)
        common = [f"--kubeconfig={self.kubeconfig}", "--leader-elect=false", "--port=0", "--bind-address=127.0.0.1",
                  "--profiling=false", "--v=1"]
        self._start("kube-controller-manager", [
            tools.exe("kube-controller-manager"), *common, f"--secure-port={p['controller-manager']}",
            f"--service-account-private-key-file={pki.sa_key}", f"--root-ca-file={pki.ca}",
            "--horizontal-pod-autoscaler-sync-period=5s",  # 15 s by default: the autoscaling tests' reaction time
            f"--cert-dir={self.root / 'controller-manager-certs'}"])
        self._start("kube-scheduler", [tools.exe("kube-scheduler"), *common, f"--secure-port={p['scheduler']}",
                                       f"--cert-dir={self.root / 'scheduler-certs'}"])
        # the default ServiceAccount exists once the controller-manager's token controller runs
        self._wait("the default ServiceAccount",
                   lambda: self.kubectl("get", "serviceaccount", "default", check=False).returncode == 0)

    def _write_node_config(self) -> None:
        cdir, cni = self.root / "containerd", self.root / "cni"
        for d in (cdir, cni / "net.d", cni / "ipam", self.root / "kubelet", self.root / "volume-plugins"):
            d.mkdir(parents=True, exist_ok=True)
        runc = shutil.which("runc", path=tools.path_env())
        # restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and without it every pod fails with
        # "can't get final child's PID from pipe". The opt plugin's path defaults to /opt/containerd.
        (cdir / "config.toml").write_text(f"""version = 2
root = "{tools.IMAGE_STORE}"
state = "{cdir / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "{self.containerd_sock}"
[ttrpc]
  address = "{cdir / 'containerd.sock.ttrpc'}"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{cdir / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{tools.CNI_BIN.resolve()}"
    conf_dir = "{cni / 'net.d'}"
    max_conf_num = 1
""")
        (cni / "net.d" / "10-serving-test.conflist").write_text(json.dumps({
            "cniVersion": "0.4.0", "name": self.bridge,
            "plugins": [
                {"type": "bridge", "bridge": self.bridge, "isGateway": True, "ipMasq": False, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(cni / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ]}, indent=1))
        # kubelet adds the host's resolv.conf search list to pods' unless told otherwise: an empty one
        (self.root / "kubelet" / "resolv.conf").write_text("")

    def _start_node(self) -> None:
        assert self.pki is not None
        self._write_node_config()
        self._start("containerd", [tools.exe("containerd"), f"--config={self.root / 'containerd' / 'config.toml'}"])
        self._wait("containerd's socket", lambda: self.ctr("version", timeout=10).returncode == 0)
        images.import_pause(self)
        self._start("cluster-dns", [sys.executable, "-m", "tests.support.kube.cluster_dns",
                                    f"--server={self.api_url}", f"--ca={self.pki.ca}",
                                    f"--cert={self.pki.client_cert}", f"--key={self.pki.client_key}",
                                    f"--listen={self.ip}:{self.ports['dns']}"])
        self._start("kubelet", [
            tools.exe("kubelet"), f"--kubeconfig={self.kubeconfig}", f"--hostname-override={NODE}",
            f"--node-ip={self.ip}", f"--address={self.ip}", f"--port={self.ports['kubelet']}",
            "--read-only-port=0", "--healthz-port=0", f"--client-ca-file={self.pki.ca}",
            "--authorization-mode=AlwaysAllow", "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{self.containerd_sock}",
            f"--image-service-endpoint=unix://{self.containerd_sock}", "--runtime-request-timeout=10m",
            f"--pod-infra-container-image={PAUSE_IMAGE}", f"--root-dir={self.root / 'kubelet'}",
            f"--cert-dir={self.root / 'kubelet' / 'pki'}", f"--volume-plugin-dir={self.root / 'volume-plugins'}",
            f"--seccomp-profile-root={self.root / 'kubelet' / 'seccomp'}",
            f"--resolv-conf={self.root / 'kubelet' / 'resolv.conf'}", f"--cluster-dns={DNS_SERVICE_IP}",
            "--cluster-domain=cluster.local", "--cgroup-driver=cgroupfs", "--cgroups-per-qos=false",
            "--enforce-node-allocatable=", "--fail-swap-on=false", "--eviction-hard=",
            "--image-gc-high-threshold=100", "--image-gc-low-threshold=99", "--make-iptables-util-chains=false",
            "--serialize-image-pulls=false", "--max-pods=40", "--v=1"])
        self._start("kube-proxy", [
            tools.exe("kube-proxy"), f"--kubeconfig={self.kubeconfig}", "--proxy-mode=iptables",
            f"--hostname-override={NODE}", f"--bind-address={self.ip}", f"--cluster-cidr={POD_CIDR}",
            f"--nodeport-addresses={self.ip}/32", "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0", "--conntrack-tcp-timeout-close-wait=0",
            f"--metrics-bind-address=127.0.0.1:{self.ports['kube-proxy-metrics']}",
            f"--healthz-bind-address=127.0.0.1:{self.ports['kube-proxy-healthz']}", "--v=1"])
        self._dns_service()
        self._wait("the node Ready and untainted", self._node_ready, timeout=120)

    def _dns_service(self) -> None:
        """kube-dns: the ClusterIP pods are told to ask, with the DNS stand-in on the node as its endpoint."""
        dns = self.ports["dns"]
        self.apply(f"""apiVersion: v1
kind: Service
metadata: {{name: kube-dns, namespace: kube-system, labels: {{k8s-app: kube-dns}}}}
spec:
  clusterIP: {DNS_SERVICE_IP}
  ports:
  - {{name: dns, port: 53, targetPort: {dns}, protocol: UDP}}
  - {{name: dns-tcp, port: 53, targetPort: {dns}, protocol: TCP}}
---
apiVersion: v1
kind: Endpoints
metadata: {{name: kube-dns, namespace: kube-system}}
subsets:
- addresses: [{{ip: "{self.ip}"}}]
  ports:
  - {{name: dns, port: {dns}, protocol: UDP}}
  - {{name: dns-tcp, port: {dns}, protocol: TCP}}
""")

    def _node_ready(self) -> bool:
        out = self.kubectl("get", "node", NODE, "-o", "json", check=False)
        if out.returncode != 0:
            return False
        node = json.loads(out.stdout)
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        return ready and not node["spec"].get("taints")

    # --- stop -----------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Take everything down; return what is still left on the host afterwards (nothing, when it works)."""
        t0 = time.monotonic()
        if "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
            self._delete_all_pods()
        for name in ("kube-proxy", "kubelet", "kube-scheduler", "kube-controller-manager", "cluster-dns"):
            self._stop(name)
        # kubelet makes its root directory a bind mount of itself (for mount propagation), and leaves it
        host_state.unmount_all(self.root / "kubelet")
        self._remove_containers()
        for name in ("containerd", "kube-apiserver", "etcd"):
            self._stop(name)
        if self.baseline is not None:
            # kube-proxy's own clean-up of its chains, as its --cleanup flag documents
            subprocess.run([tools.exe("kube-proxy"), "--cleanup", "--v=0"], capture_output=True, timeout=60,
                           env=self._env())
            self.undone = host_state.undo_expected(self.baseline, self.bridge)
            self.forced += host_state.remove_leftovers(self.baseline, self.root, self.bridge, POD_CIDR, SERVICE_CIDR)
        if not host_state.mounts_under(self.root):  # never delete through a mount still there
            shutil.rmtree(self.root, ignore_errors=True)
        if self._store_lock is not None:
            self._store_lock.close()
            self._store_lock = None
        self.timings["stop"] = time.monotonic() - t0
        return host_state.leftovers(self.baseline, self.root, self.bridge, POD_CIDR, SERVICE_CIDR) \
            if self.baseline is not None else []

    def _delete_all_pods(self) -> None:
        """Every pod deleted through the API, then kubelet given the time to stop their sandboxes (CNI DEL:
        veth, IP lease, portmap rules, network namespace) and unmount their volumes. What does not go
        this way is named in ``forced`` (and removed by ``remove_leftovers``)."""
        def drained() -> bool:
            pods = self.get("pods", "--all-namespaces")["items"]
            running = self.ctr("tasks", "ls", "-q", timeout=30).stdout.split()
            return not pods and not running and not host_state.mounts_under(self.root / "kubelet" / "pods") \
                and not (self.baseline and host_state.new_netns(self.baseline))
        try:
            for ns in [n["metadata"]["name"] for n in self.get("namespaces")["items"]]:
                self.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=1", "--wait=false", check=False)
            wait_until(drained, 120, "every pod gone, its containers stopped, volumes unmounted, netns removed",
                       interval=0.5)
        except (AssertionError, OSError, ValueError, subprocess.SubprocessError) as exc:
            self.forced.append(f"pods not drained gracefully: {str(exc)[:500]}")

    def _remove_containers(self) -> None:
        """Stopped containers and sandboxes (kubelet's garbage collector would take them a minute later)."""
        if self.procs.get("containerd") is None or self.procs["containerd"].poll() is not None:
            return
        for cid in self.ctr("containers", "ls", "-q", timeout=60).stdout.split():
            self.ctr("tasks", "kill", "-s", "SIGKILL", cid, timeout=30)
            self.ctr("tasks", "delete", cid, timeout=30)
            self.ctr("containers", "delete", cid, timeout=60)

    def _stop(self, name: str, timeout: float = 20) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            self.forced.append(f"{name} did not stop on SIGTERM within {timeout}s: killed")


def new_cluster() -> Cluster:
    root = Path(tempfile.mkdtemp(prefix=host_state.CLUSTER_DIR_PREFIX))
    os.chmod(root, 0o755)  # pods' users (uid 10001, 70, 1000) traverse it to their local volumes
    return Cluster(root=root, ip=node_ip(), bridge=f"skube{os.getpid() % 100000}")


"""What a test cluster may leave on the host, and its removal.

A cluster started by cluster.py changes the host in these ways, each named after the cluster so it
can be told apart from what other users of the machine (podman's networks, another engineer's
containers) own:

- processes: every one it starts has the cluster's temporary directory on its command line
  (containerd's shims name its socket there);
- mounts: kubelet's volumes (tmpfs for Secrets and service-account tokens), containerd's overlay
  root file systems and sandbox /dev/shm, under the temporary directory or containerd's root (the
  image store kept in the kube cache, tools.IMAGE_STORE);
- network: the CNI bridge (named per cluster), the pods' network namespaces (``cni-*`` in
  /run/netns), iptables chains and rules of kube-proxy (``KUBE-*``) and of the portmap and bridge
  plugins (``CNI-*``, rules naming the pod or Service range);
- files: the temporary directory; /var/log/pods, /run/containerd and /run/netns (kubelet, containerd's
  shims and its CRI write there whatever their configuration says; removed only when the cluster made
  them and they are empty);
- sysctls kubelet and kube-proxy set (restored to what they were). ``net.ipv4.ip_forward`` and
  ``net.bridge.bridge-nf-call-iptables`` are left as they are: podman's networks need them as well,
  and resetting them under a running container stack would cut it off.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import psutil

NETNS = Path("/run/netns")
CLUSTER_DIR_PREFIX = "serving-kube-"  # each cluster's temporary directory (cluster.new_cluster)
BRIDGE_NAME = re.compile(r"skube\d+")  # each cluster's CNI bridge (cluster.new_cluster)
# containerd's root (images, snapshots), kept across sessions in the kube cache (tools.py): no mount may stay
from tests.support.kube.tools import IMAGE_STORE  # noqa: E402
from tests.support.procs import kill_all  # noqa: E402
HOST_DIRS = (NETNS, Path("/var/log/pods"), Path("/var/log/containers"), Path("/run/containerd"), Path("/var/lib/cni"),
             Path("/var/lib/kubelet"), Path("/etc/cni"), Path("/opt/containerd"))
# set by kubelet (setupKernelTunables) and kube-proxy (route_localnet for NodePorts on loopback)
SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
           "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes", "net/ipv4/conf/all/route_localnet")


@dataclass
class Snapshot:
    netns: set[str] = field(default_factory=set)
    dirs: set[Path] = field(default_factory=set)
    chains: set[str] = field(default_factory=set)  # "table/chain" present before the cluster
    sysctls: dict[str, str] = field(default_factory=dict)


def snapshot() -> Snapshot:
    return Snapshot(netns=_netns(), dirs={d for d in HOST_DIRS if d.exists()}, chains=set(_chains()),
                    sysctls={k: (Path("/proc/sys") / k).read_text().strip() for k in SYSCTLS
                             if (Path("/proc/sys") / k).exists()})


def _netns() -> set[str]:
    return {p.name for p in NETNS.iterdir()} if NETNS.is_dir() else set()


def new_netns(base: Snapshot) -> set[str]:
    """Network namespaces made since ``base`` by containerd's CRI (``cni-<uuid>``)."""
    return {n for n in _netns() - base.netns if n.startswith("cni-")}


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def mounts_under(root: Path) -> list[str]:
    prefix = str(root.resolve() if root.exists() else root)
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def is_mount(path: Path) -> bool:
    """From mountinfo: ``os.path.ismount`` misses a directory bind-mounted onto itself (same device)."""
    return str(path) in {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()}


def unmount_all(path: Path) -> int:
    """Unmount ``path`` as many times as it is mounted; the count."""
    n = 0
    while is_mount(path) and subprocess.run(["umount", str(path)], capture_output=True).returncode == 0:
        n += 1
    return n


def _iptables_save() -> str:
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=60)
    return out.stdout


def _chains(text: str | None = None) -> list[str]:
    table, found = "", []
    for line in (text if text is not None else _iptables_save()).splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":"):
            found.append(f"{table}/{line[1:].split()[0]}")
    return found


def _ours(base: Snapshot, chain: str) -> bool:
    name = chain.split("/", 1)[1]
    return chain not in base.chains and (name.startswith("KUBE-") or name.startswith("CNI-"))


def _our_rules(base: Snapshot, text: str, bridge: str, cidrs: tuple[str, ...]) -> list[tuple[str, str]]:
    """(table, rule) of rules in built-in or foreign chains that jump to our chains or name our network."""
    table, rules = "", []
    for line in text.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A "):
            chain = line.split()[1]
            jump = re.search(r" -j (\S+)", line)
            target = f"{table}/{jump.group(1)}" if jump else ""
            if (target and _ours(base, target)) or any(c in line for c in cidrs) or \
                    (bridge and f" {bridge} " in f"{line} "):
                if not _ours(base, f"{table}/{chain}"):
                    rules.append((table, line))
    return rules


def _processes(root: Path) -> list[psutil.Process]:
    needle, found = str(root), []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != os.getpid() and any(needle in a for a in proc.info["cmdline"] or []):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def leftovers(base: Snapshot, root: Path, bridge: str, pod_cidr: str, service_cidr: str) -> list[str]:
    """Everything of the cluster still on the host (an empty list after a clean stop)."""
    found = [f"process: {p.pid} {' '.join(p.cmdline())[:160]}" for p in _processes(root)]
    found += [f"container process: {p.pid} {' '.join(p.cmdline())[:160]}" for p in container_processes()]
    found += [f"mount: {m}" for r in (root, IMAGE_STORE) for m in mounts_under(r)]
    found += [f"network namespace: {n}" for n in sorted(new_netns(base))]
    if link_exists(bridge):
        found.append(f"bridge: {bridge}")
    text = _iptables_save()
    found += [f"iptables chain: {c}" for c in _chains(text) if _ours(base, c)]
    found += [f"iptables rule ({t}): {r}" for t, r in _our_rules(base, text, bridge, (pod_cidr, service_cidr))]
    found += [f"directory: {d}" for d in HOST_DIRS if d.exists() and d not in base.dirs]
    if root.exists():
        found.append(f"directory: {root}")
    for key, value in base.sysctls.items():
        now = (Path("/proc/sys") / key).read_text().strip()
        if now != value:
            found.append(f"sysctl {key}: {now} (was {value})")
    return found


def undo_expected(base: Snapshot, bridge: str) -> list[str]:
    """The part of a clean stop that no component does itself: delete the CNI bridge; restore the sysctls
    kubelet and kube-proxy set; remove the host directories kubelet, containerd and its shims made
    (/var/log/pods, /var/lib/kubelet/device-plugins, /run/containerd/s, /run/netns) and the iptables chains
    left by the portmap plugin (CNI-HOSTPORT-*) and by `kube-proxy --cleanup`, each only when the cluster
    made them. Returns what was done."""
    done = []
    if link_exists(bridge):  # the bridge plugin never deletes its bridge, even after its last pod
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
        done.append(f"bridge {bridge} removed")
    for key, value in base.sysctls.items():
        path = Path("/proc/sys") / key
        if path.read_text().strip() != value:
            path.write_text(value)
            done.append(f"sysctl {key} restored to {value}")
    for d in HOST_DIRS:
        # no regular file: what is left is empty directories and the stale sockets of stopped servers
        # (kubelet's device-plugin socket in /var/lib/kubelet/device-plugins, a path kubelet 1.20 fixes)
        # /var/lib/kubelet: only kubelet 1.20's device-plugin directory, fixed there whatever --root-dir says
        fixed_by_kubelet = d == Path("/var/lib/kubelet")
        if d.exists() and d not in base.dirs and (fixed_by_kubelet or not any(p.is_file() for p in d.rglob("*"))):
            # containerd's CRI makes /run/netns a shared bind mount of itself before its first namespace
            if unmount_all(d):
                done.append(f"mount {d} removed")
            shutil.rmtree(d, ignore_errors=True)
            done.append(f"directory {d} removed (no file in it)")
    text = _iptables_save()
    # portmap's shared chains, and what `kube-proxy --cleanup` keeps: the chains it shares with kubelet
    # (KUBE-MARK-DROP, KUBE-MARK-MASQ) and its canaries (KUBE-PROXY-CANARY)
    shared = [c for c in _chains(text) if _ours(base, c)
              and (c.split("/", 1)[1].startswith("CNI-HOSTPORT-")
                   or c.split("/", 1)[1] in ("KUBE-MARK-DROP", "KUBE-MARK-MASQ", "KUBE-PROXY-CANARY"))]
    for table, rule in _our_rules(base, text, "", ()):
        if any(f"-j {c.split('/', 1)[1]}" in rule for c in shared):
            subprocess.run(["iptables", "-w", "-t", table, "-D", *_unquote(rule.split()[1:])], capture_output=True)
    for chain in shared:
        table, name = chain.split("/", 1)
        subprocess.run(["iptables", "-w", "-t", table, "-F", name], capture_output=True)
    for chain in shared:
        table, name = chain.split("/", 1)
        subprocess.run(["iptables", "-w", "-t", table, "-X", name], capture_output=True)
        done.append(f"iptables chain {chain} removed")
    return done


def remove_leftovers(base: Snapshot, root: Path, bridge: str, pod_cidr: str, service_cidr: str) -> list[str]:
    """Remove what ``leftovers`` would name; return what had to be removed."""
    removed = kill_all(_processes(root), "process")
    removed += _unmount([root, IMAGE_STORE])
    for name in new_netns(base):
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        removed.append(f"netns {name}")
    if link_exists(bridge):
        subprocess.run(["ip", "link", "delete", bridge], capture_output=True)
        removed.append(f"bridge {bridge}")
    removed += _remove_iptables(base, bridge, (pod_cidr, service_cidr))
    for d in HOST_DIRS:
        if d.exists() and d not in base.dirs:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(f"directory {d}")
    for key, value in base.sysctls.items():
        path = Path("/proc/sys") / key
        if path.read_text().strip() != value:
            path.write_text(value)
            removed.append(f"sysctl {key} restored to {value}")
    return removed


def clear_dead_clusters(own_root: Path, pod_cidr: str, service_cidr: str) -> list[str]:
    """Remove what clusters killed before their stop left (a test run killed mid-way skips every
    teardown); return what was removed. Called with containerd's lock held, so no live cluster owns any
    of it. Without this a dead cluster's bridge keeps the route to the pod range and the next cluster's
    pods are unreachable from the host: every kubelet probe times out (a CI run lost 16 tests to it)."""
    removed = []
    dead_roots = [r for r in own_root.parent.glob(f"{CLUSTER_DIR_PREFIX}*") if r != own_root and r.is_dir()]
    # their containers' processes outlive a killed shim (reparented to init) and name no cluster directory:
    # found by their cgroup, containerd's namespace k8s.io (only a test cluster's CRI uses it here)
    removed += kill_all(container_processes(), "container process")
    for root in dead_roots:
        removed += kill_all(_processes(root), "process")
    removed += _unmount([*dead_roots, IMAGE_STORE])
    for name in sorted(n for n in _netns() if n.startswith("cni-")):  # only containerd's CRI names them so
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
        removed.append(f"netns {name}")
    for link in sorted(p.name for p in Path("/sys/class/net").iterdir() if BRIDGE_NAME.fullmatch(p.name)):
        subprocess.run(["ip", "link", "delete", link], capture_output=True)
        removed.append(f"bridge {link}")
    removed += _remove_iptables(Snapshot(), "", (pod_cidr, service_cidr))  # every KUBE-* and CNI-* chain
    for root in dead_roots:
        if not mounts_under(root):
            shutil.rmtree(root, ignore_errors=True)
            removed.append(f"directory {root}")
    return removed


def _unmount(roots: list[Path]) -> list[str]:
    """Every mount under ``roots``, deepest first, lazily (a dead process may still hold one)."""
    points = sorted((m for r in roots for m in mounts_under(r)), key=len, reverse=True)
    for point in points:
        subprocess.run(["umount", "-l", point], capture_output=True)
    return [f"mount {point}" for point in points]


def container_processes() -> list[psutil.Process]:
    """Processes in a cgroup of containerd's namespace k8s.io (``.../k8s.io/<container id>``)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if any(":/k8s.io/" in line for line in Path(f"/proc/{proc.pid}/cgroup").read_text().splitlines()):
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def _remove_iptables(base: Snapshot, bridge: str, cidrs: tuple[str, ...]) -> list[str]:
    text, removed = _iptables_save(), []
    for table, rule in _our_rules(base, text, bridge, cidrs):
        args = rule.split()[1:]  # without -A
        subprocess.run(["iptables", "-w", "-t", table, "-D", *_unquote(args)], capture_output=True)
        removed.append(f"iptables rule ({table}) {rule}")
    ours = [c for c in _chains(text) if _ours(base, c)]
    for chain in ours:  # empty them first: they may jump to one another
        table, name = chain.split("/", 1)
        subprocess.run(["iptables", "-w", "-t", table, "-F", name], capture_output=True)
    for chain in ours:
        table, name = chain.split("/", 1)
        subprocess.run(["iptables", "-w", "-t", table, "-X", name], capture_output=True)
        removed.append(f"iptables chain {chain}")
    return removed


def _unquote(args: list[str]) -> list[str]:
    """iptables-save quotes comments ("-m comment --comment \"a b\""): rejoin them for -D."""
    out, buf = [], None
    for a in args:
        if buf is not None:
            buf.append(a)
            if a.endswith('"'):
                out.append(" ".join(buf).strip('"'))
                buf = None
        elif a.startswith('"') and not (a.endswith('"') and len(a) > 1):
            buf = [a]
        else:
            out.append(a.strip('"') if a.startswith('"') else a)
    return out

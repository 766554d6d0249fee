"""Where the cluster's programs are: the cache scripts/kube-build.sh fills, and a few system tools.

``missing()`` names what is not there, for ``cannot_run`` (a failure in CI, a skip elsewhere).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

CACHE = Path(os.environ.get("SERVING_KUBE_CACHE", Path.home() / ".cache" / "serving-kube"))
BIN = CACHE / "bin"
CNI_BIN = CACHE / "cni-bin"
# containerd's root directory (content and unpacked snapshots of the imported images), kept across
# sessions: an image already imported is not copied again (images.py); one cluster at a time uses it
IMAGE_STORE = CACHE / "containerd-root"
KUBE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl")
OTHERS = ("etcd", "containerd", "containerd-shim-runc-v2", "ctr", "helm")
CNI = ("bridge", "host-local", "portmap")
SYSTEM = ("runc", "iptables", "iptables-save", "ip", "openssl", "mount", "umount", "nsenter", "gcc")


def exe(name: str) -> str:
    """The cached binary, or the system's."""
    cached = BIN / name
    return str(cached) if cached.exists() else (shutil.which(name) or name)


def path_env() -> str:
    """PATH with the cache first: containerd starts its shim by name, kubelet finds mount/nsenter."""
    return f"{BIN}:{os.environ.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}:/usr/sbin:/sbin"


def missing() -> str | None:
    """None when a cluster can be started here, else why not."""
    if os.geteuid() != 0:
        return "a cluster node (containerd, kubelet, kube-proxy's iptables) needs root"
    absent = [n for n in KUBE + OTHERS if not os.access(BIN / n, os.X_OK)]
    absent += [f"cni/{n}" for n in CNI if not os.access(CNI_BIN / n, os.X_OK)]
    if absent:
        return (f"Kubernetes binaries missing from {BIN} ({', '.join(absent)}): run scripts/kube-build.sh "
                "(`make test` runs it)")
    sys_absent = [n for n in SYSTEM if shutil.which(n, path=path_env()) is None]
    if sys_absent:
        return f"system tools missing: {', '.join(sys_absent)} (scripts/kube-build.sh installs them)"
    try:
        import dnslib  # noqa: F401  (the cluster-DNS stand-in)
    except ImportError:
        return "the Python package dnslib is missing (the project's test extra installs it)"
    return None

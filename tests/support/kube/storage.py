"""Storage for PersistentVolumeClaims on the test node: a default StorageClass of ``local`` volumes
(directories under the cluster's temporary directory) with a pool of PersistentVolumes made ahead.

There is no provisioner on this node (a cloud's or a CSI driver's would make volumes on demand);
``local`` volumes, unlike ``hostPath`` ones, get the pod's ``fsGroup`` applied by kubelet, so a
pod running as uid 10001 (or 70, 1000) can write to its claim as it would on a real cluster's
storage. ``WaitForFirstConsumer`` binds a claim when its pod is scheduled, as most classes do.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tests.support.kube.cluster import Cluster

CLASS = "local-test"


def provide(cluster: "Cluster", count: int, capacity: str = "100Gi") -> None:
    """``count`` volumes Available for the next release: those an earlier release's claims held (Released,
    kept by the Retain policy) are emptied and made again."""
    recycle(cluster)
    docs = [f"""apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {CLASS}
  annotations: {{storageclass.kubernetes.io/is-default-class: "true"}}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Retain"""]
    for i in range(count):
        path = cluster.root / "volumes" / f"pv{i}"
        path.mkdir(parents=True, exist_ok=True)
        docs.append(f"""apiVersion: v1
kind: PersistentVolume
metadata: {{name: {CLASS}-{i}}}
spec:
  capacity: {{storage: {capacity}}}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: {CLASS}
  local: {{path: "{path}"}}
  nodeAffinity:
    required:
      nodeSelectorTerms:
      - matchExpressions: [{{key: kubernetes.io/hostname, operator: In, values: [{cluster.node}]}}]""")
    cluster.apply("\n---\n".join(docs))


def recycle(cluster: "Cluster") -> None:
    """Delete the pool's Released volumes and empty their directories (``provide`` makes them again):
    the next release of the same name must start with an empty database, as on a new cluster."""
    for pv in cluster.get("pv")["items"]:
        if pv["spec"].get("storageClassName") != CLASS or pv["status"].get("phase") != "Released":
            continue
        cluster.kubectl("delete", "pv", pv["metadata"]["name"], "--wait=true", timeout=120)
        path = Path(pv["spec"]["local"]["path"])
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)

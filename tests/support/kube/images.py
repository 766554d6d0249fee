"""Images into the test node's containerd, with no registry.

- The pause image (every pod's sandbox): a static C program of our own that sleeps until SIGTERM or
  SIGINT, compiled with ``gcc -static``, written here as an OCI image archive (one layer holding
  /pause) and imported with ``ctr images import``.
- The platform's images (scripts/images.sh builds them with podman, as the compose test does):
  ``podman save --format docker-archive`` and ``ctr -n k8s.io images import``, once per image id:
  containerd's root is kept in the kube cache (tools.IMAGE_STORE), so a session whose images did not
  change since the last one (podman's layer cache gives the same id) copies nothing.
  Docker's archive format rather than ``oci-archive``: its layers are not compressed, which took the
  save of the 870 MB serving image from 91 s to 23 s here (both import the same).
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Protocol

from tests.support.kube import tools

PAUSE_IMAGE = "localhost/serving-kube-pause:1"


class Node(Protocol):
    """What these functions need of a cluster: ``ctr`` against its containerd, namespace k8s.io."""

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess: ...

PAUSE_C = r"""
/* The sandbox process of a test pod: holds the pod's namespaces until it is told to stop. */
#include <signal.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; }
int main(void) {
    signal(SIGTERM, stop);
    signal(SIGINT, stop);
    signal(SIGCHLD, reap);
    for (;;) pause();
}
"""


def _blob(layout: tarfile.TarFile, data: bytes, digests: dict) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    layout.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def pause_archive(workdir: Path, name: str) -> Path:
    """An OCI image archive named ``name`` whose entrypoint is a static /pause."""
    src, binary = workdir / "pause.c", workdir / "pause"
    src.write_text(PAUSE_C)
    out = subprocess.run(["gcc", "-static", "-Os", "-s", "-o", str(binary), str(src)], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"gcc -static failed (libc6-dev has the static libc): {out.stderr[-800:]}")
    layer_raw = io.BytesIO()
    with tarfile.open(fileobj=layer_raw, mode="w") as layer:
        info = layer.gettarinfo(str(binary), arcname="pause")
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        info.mtime = 0
        with open(binary, "rb") as f:
            layer.addfile(info, f)
    diff_id = "sha256:" + hashlib.sha256(layer_raw.getvalue()).hexdigest()
    layer_gz = gzip.compress(layer_raw.getvalue(), mtime=0)
    archive = workdir / "pause.oci.tar"
    with tarfile.open(archive, "w") as oci:
        digests: dict = {}
        config = json.dumps({"architecture": "amd64", "os": "linux",
                             "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
                             "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config),
                       "digest": _blob(oci, config, digests)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": len(layer_gz),
                        "digest": _blob(oci, layer_gz, digests)}]}).encode()
        index = json.dumps({"schemaVersion": 2, "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "size": len(manifest),
            "digest": _blob(oci, manifest, digests),
            "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}}]}).encode()
        for fname, data in (("oci-layout", b'{"imageLayoutVersion": "1.0.0"}'), ("index.json", index)):
            info = tarfile.TarInfo(fname)
            info.size = len(data)
            oci.addfile(info, io.BytesIO(data))
    return archive


def _ref_name(archive: Path) -> str:
    """The name an archive gives its image: an OCI index's annotation (the whole name, or only a tag) or
    a Docker archive's RepoTags."""
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        if "index.json" in names:
            index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
            notes = index["manifests"][0].get("annotations", {})
            return notes.get("io.containerd.image.name") or notes.get("org.opencontainers.image.ref.name", "")
        manifest = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        return (manifest[0].get("RepoTags") or [""])[0]


def import_archive(cluster: Node, archive: Path, name: str) -> None:
    """``ctr images import`` (unpacked into the CRI's overlayfs snapshotter), under ``name``."""
    ref = _ref_name(archive)
    base = ["--base-name", name.rsplit(":", 1)[0]] if ref and "/" not in ref and ":" not in ref else []
    out = cluster.ctr("images", "import", *base, str(archive), timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"ctr images import {archive.name}: {out.stderr[-1500:]}")
    present = cluster.ctr("images", "ls", "-q").stdout.split()
    if name not in present:
        imported = f"{base[1]}:{ref}" if base else ref
        if imported not in present or cluster.ctr("images", "tag", imported, name).returncode != 0:
            raise RuntimeError(f"{name} not in containerd after importing {archive.name} (has: {present})")


def import_pause(cluster: Node) -> None:
    drop_orphan_refs(cluster)  # the node's first call: what earlier sessions left is collected here
    if PAUSE_IMAGE in cluster.ctr("images", "ls", "-q").stdout.split():
        return
    with tempfile.TemporaryDirectory(prefix="serving-kube-pause-") as tmp:
        import_archive(cluster, pause_archive(Path(tmp), PAUSE_IMAGE), PAUSE_IMAGE)


def orphan_refs(listing: str) -> list[str]:
    """The ``sha256:<image id>`` references in ``ctr images ls`` output that no name shares a target with.

    The CRI plugin names every image it sees also by its id, and removing our tag leaves that
    reference behind: the store kept every old build (38 GB here before this, and CI's disk ran out)."""
    rows = [line.split() for line in listing.splitlines()[1:] if line.strip()]
    named = {row[2] for row in rows if len(row) > 2 and not row[0].startswith("sha256:")}
    return [row[0] for row in rows if len(row) > 2 and row[0].startswith("sha256:") and row[2] not in named]


def drop_orphan_refs(cluster: Node) -> None:
    """Remove those references, so that containerd collects the old builds' content and snapshots."""
    for ref in orphan_refs(cluster.ctr("images", "ls").stdout):
        cluster.ctr("images", "rm", "--sync", ref)


def import_podman_image(cluster: Node, image: str, env: dict[str, str]) -> float:
    """Copy ``image`` from podman's store into the node, unless the node's image store (kept across
    sessions, tools.IMAGE_STORE) has this very image (same podman id) already; return the seconds it took."""
    start = time.monotonic()
    inspect = subprocess.run(["podman", "image", "inspect", "--format", "{{.Id}}", image], env=env,
                             capture_output=True, text=True, timeout=120)
    if inspect.returncode != 0:
        raise RuntimeError(f"podman has no image {image}: {inspect.stderr[-500:]}")
    image_id, repository = inspect.stdout.strip(), image.rsplit(":", 1)[0]
    record = tools.IMAGE_STORE / "imported" / repository.replace("/", "_")  # "<podman id> <name in the store>"
    present = cluster.ctr("images", "ls", "-q").stdout.split()
    known = record.read_text().split() if record.exists() else []
    if len(known) == 2 and known[0] == image_id and known[1] in present:
        if image not in present and cluster.ctr("images", "tag", known[1], image).returncode != 0:
            raise RuntimeError(f"ctr images tag {known[1]} {image} failed")
        return time.monotonic() - start
    for old in present:  # older builds of the repository: dropped (containerd collects their content)
        if old.rsplit(":", 1)[0] == repository:
            cluster.ctr("images", "rm", "--sync", old)
    drop_orphan_refs(cluster)
    with tempfile.TemporaryDirectory(prefix="serving-kube-image-", dir=tools.CACHE) as tmp:
        archive = Path(tmp) / "image.tar"
        out = subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(archive), image], env=env,
                             capture_output=True, text=True, timeout=900)
        if out.returncode != 0:
            raise RuntimeError(f"podman save {image}: {out.stderr[-1500:]}")
        import_archive(cluster, archive, image)
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(f"{image_id} {image}\n")
    return time.monotonic() - start

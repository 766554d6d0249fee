"""The test node's image store is kept across sessions, so what a session leaves in it must be collectable.

The CRI plugin names each image it sees by its id as well (``sha256:<id>``). When a rebuild replaced our
tag, that id name stayed and kept the old build's layers: the store grew by a build a commit, to 38 GB,
until a CI run's disk was full. ``orphan_refs`` finds those names (a pure function of ``ctr images ls``)."""
from __future__ import annotations

from tests.support.kube.images import orphan_refs

HEADER = "REF TYPE DIGEST SIZE PLATFORMS LABELS"
DOCKER = "application/vnd.docker.distribution.manifest.v2+json"


def row(ref: str, digest: str) -> str:
    return f"{ref} {DOCKER} sha256:{digest} 839.0 MiB linux/amd64 io.cri-containerd.image=managed"


def test_an_id_name_whose_build_lost_its_tag_is_an_orphan_and_a_tagged_ones_is_not():
    listing = "\n".join([
        HEADER,
        row("localhost/serving:kube-new", "aaa"),
        row("sha256:0001", "aaa"),  # the current build's id name: kept
        row("sha256:0002", "bbb"),  # an older build's: its tag was removed
        row("sha256:0003", "ccc"),
        row("localhost/serving-standin-kafka:kube-1", "ddd"),
        row("sha256:0004", "ddd"),
        "",
    ])
    assert orphan_refs(listing) == ["sha256:0002", "sha256:0003"]


def test_an_empty_store_and_a_store_of_names_only_have_no_orphans():
    assert orphan_refs(HEADER + "\n") == []
    assert orphan_refs("\n".join([HEADER, row("localhost/serving-kube-pause:1", "eee")])) == []

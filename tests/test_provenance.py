"""Only what this project wrote is in the repository: no other project's license or notice files,
no copyright or license headers of another holder, no file (or a good part of one) that is known to
come from elsewhere, no binary data in tests/ (tests make their pictures and models as they run).

Every tracked file is read (``git ls-files``, with new files not ignored). Each detector is also run on planted samples in a
temporary folder, so a detector that stopped finding anything fails here too. Facts about other
projects (their interfaces, command flags, REST paths) are fine; their files and text are not.
"""
from __future__ import annotations

import hashlib
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FINGERPRINTS = Path(__file__).with_name("foreign_fingerprints.txt")
OWN_LICENSE_FILES = {"LICENSE"}  # the project's own, at the root only
OWN_HOLDERS: tuple[str, ...] = ()  # copyright lines naming these are ours (none are written today)
SHARED_LINES_LIMIT = 3  # distinctive lines a file may share with a known foreign file by coincidence

LICENSE_FILE = re.compile(r"^(licen[cs]e|notice|copying|copyright|authors|patents|third[-_]party[-_]notices?)"
                          r"([-_.].*)?$", re.IGNORECASE)
# Header and license-body phrases; written so that this file's own source does not match them.
FOREIGN_TEXT = [re.compile(p, re.IGNORECASE) for p in (
    r"\bcopyright\s*(\(c\)|©|\d{4})",
    r"\(c\)\s*\d{4}(\s*[-,]\s*\d{4})*\s+\w",
    r"\ball\s+rights\s+reserved\b",
    r"\bspdx-(license-identifier|filecopyrighttext)\s*:",
    r"\blicensed\s+under\s+the\s+(apache|mit|gnu|bsd|mozilla|eclipse|creative)",
    r"\bapache\s+license,?\s+version\s+2",
    r"\bpermission\s+is\s+hereby\s+granted,\s+free\s+of\s+charge",
    r"\bredistribution\s+and\s+use\s+in\s+source\s+and\s+binary\s+forms",
    r"\bgnu\s+(lesser\s+|affero\s+)?general\s+public\s+license\b",
    r"\bmozilla\s+public\s+license\b",
)]
BINARY_SUFFIXES = {".jpg", ".jpeg", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff", ".ico", ".pdf", ".npy",
                   ".npz", ".pkl", ".pickle", ".onnx", ".pt", ".pth", ".h5", ".bin", ".safetensors", ".parquet",
                   ".zip", ".gz", ".tgz", ".tar", ".whl", ".wav", ".mp3", ".mp4"}


@dataclass(frozen=True)
class Finding:
    path: str
    why: str

    def __str__(self) -> str:
        return f"{self.path}: {self.why}"


# --- detectors -------------------------------------------------------------------------------------
def git_blob_id(data: bytes) -> str:
    """What ``git hash-object`` says for these bytes: the id a copied file keeps wherever it lands."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _normal(line: str) -> str:
    return " ".join(line.lower().split())


def _distinctive(line: str) -> bool:
    """Long enough to be telling; signatures and imports are interface facts anyone writes alike."""
    return len(line) >= 30 and not line.startswith(("def ", "async def ", "import ", "from ", "class "))


def fingerprints(text: str) -> set[str]:
    return {hashlib.sha256(n.encode()).hexdigest()[:16] for n in map(_normal, text.splitlines()) if _distinctive(n)}


def load_fingerprints(path: Path = FINGERPRINTS) -> tuple[set[str], set[str]]:
    blobs, lines = set(), set()
    for row in path.read_text().splitlines():
        if row and not row.startswith("#"):
            kind, value = row.split()
            (blobs if kind == "blob" else lines).add(value)
    return blobs, lines


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:8192]


def findings(root: Path, paths: list[str], blobs: set[str], lines: set[str]) -> list[Finding]:
    found: list[Finding] = []
    for rel in paths:
        path = root / rel
        if not path.is_file():
            continue
        data = path.read_bytes()
        if LICENSE_FILE.match(path.name) and rel not in OWN_LICENSE_FILES:
            found.append(Finding(rel, "a license/notice file of its own: another project's"))
        if git_blob_id(data) in blobs:
            found.append(Finding(rel, "the exact bytes of a known third-party file"))
        if rel.startswith("tests/") and (path.suffix.lower() in BINARY_SUFFIXES or is_binary(data)):
            found.append(Finding(rel, "binary data under tests/: build it in the test instead"))
        if is_binary(data):
            continue
        text = data.decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            if any(p.search(line) for p in FOREIGN_TEXT) and not any(h.lower() in line.lower() for h in OWN_HOLDERS):
                found.append(Finding(f"{rel}:{number}", f"copyright/license text: {line.strip()[:100]!r}"))
        shared = fingerprints(text) & lines
        if len(shared) >= SHARED_LINES_LIMIT:
            found.append(Finding(rel, f"{len(shared)} distinctive lines of a known third-party file"))
    return found


def tracked() -> list[str]:
    """Files git tracks, and new ones it would (not ignored): caught before they are committed."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


# --- the repository ------------------------------------------------------------------------------------
def test_every_tracked_file_is_ours():
    paths = tracked()
    assert len(paths) > 100 and "tests/test_provenance.py" in paths  # the listing itself worked
    blobs, lines = load_fingerprints()
    found = findings(REPO, paths, blobs, lines)
    assert not found, "third-party material in the tree:\n" + "\n".join(map(str, found))


def test_the_known_foreign_fingerprints_are_loaded():
    blobs, lines = load_fingerprints()
    assert len(blobs) >= 10 and all(re.fullmatch(r"[0-9a-f]{40}", b) for b in blobs)
    assert len(lines) >= 100 and all(re.fullmatch(r"[0-9a-f]{16}", x) for x in lines)


# --- the detectors find what is planted ------------------------------------------------------------------
HOLDER = "Example Holder Inc."
PLANTED = {  # text assembled from pieces, so this file does not carry it
    "vendor/x/LICENSE": "any text",
    "docs/NOTICE.txt": "any text",
    "lib/COPYING": "any text",
    "tests/fixtures/header.py": "# Copy" + f"right (c) 2021 {HOLDER}\nx = 1\n",
    "tests/fixtures/year.py": "# Copy" + f"right 2019-2024 {HOLDER}\n",
    "docs/page.md": "Licensed " + "under the Apache " + "License, Version 2.0 (the \"License\");\n",
    "src/spdx.py": "# SPDX-" + "License-Identifier: MIT\n",
    "src/mit.txt": "Permission is " + "hereby granted, free of charge, to any person\n",
    "src/bsd.c": "/* Redistribution " + "and use in source and binary forms, with or without */\n",
    "src/gpl.py": "# GNU General " + "Public License for more details.\n",
    "src/reserved.js": "// (C) 2020 " + HOLDER + " All rights " + "reserved.\n",
}
CLEAN = {
    "docs/ok.md": "Facts about another project are fine: its `--aux-config` flag, its `/serve` path.\n"
                  "The word copyright alone, or a licence in prose, is not a header.\n",
    "src/licensing.py": "def license_key():\n    return None\n",
}


def _plant(root: Path, files: dict[str, str | bytes]) -> list[str]:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return list(files)


@pytest.mark.parametrize("rel", sorted(PLANTED))
def test_each_planted_sample_is_found(tmp_path, rel):
    paths = _plant(tmp_path, {rel: PLANTED[rel]})
    found = findings(tmp_path, paths, set(), set())
    assert found and all(f.path.split(":")[0] == rel for f in found), found


def test_clean_files_pass(tmp_path):
    assert findings(tmp_path, _plant(tmp_path, CLEAN), set(), set()) == []


def test_a_known_file_is_found_by_its_bytes_under_any_name(tmp_path):
    content = b"def f():\n    return 'a file that came from somewhere else'\n"
    blob = subprocess.run(["git", "hash-object", "--stdin"], input=content, capture_output=True, check=True)
    assert git_blob_id(content) == blob.stdout.decode().strip()  # the stored ids are git's
    paths = _plant(tmp_path, {"serving/renamed.py": content})
    assert [f.why for f in findings(tmp_path, paths, {git_blob_id(content)}, set())] == \
        ["the exact bytes of a known third-party file"]


def test_a_partial_copy_is_found_by_its_lines(tmp_path):
    foreign = "\n".join(f"    result = compute_the_{n}th_value_of_the_series(x, y)  # step {n}" for n in range(6))
    lines = fingerprints(foreign)
    kept = "\n".join(foreign.splitlines()[:3]) + "\n# then our own code, re-indented:\n"
    reformatted = "\n".join("  " + line.strip().upper() for line in foreign.splitlines()[3:5])
    one_line = foreign.splitlines()[0]
    paths = _plant(tmp_path, {"tests/copied.py": kept, "tests/reformatted.py": reformatted + "\n" + one_line,
                              "tests/coincidence.py": one_line})
    found = {f.path for f in findings(tmp_path, paths, set(), lines)}
    assert found == {"tests/copied.py", "tests/reformatted.py"}  # one shared line alone is allowed


def test_binary_data_in_tests_is_found(tmp_path):
    picture = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR"
    paths = _plant(tmp_path, {"tests/data/digit.png": picture, "tests/data/blob.dat": b"\0\1\2",
                              "benchmarks/results/plot.png": picture})
    assert {f.path for f in findings(tmp_path, paths, set(), set())} == {"tests/data/digit.png", "tests/data/blob.dat"}

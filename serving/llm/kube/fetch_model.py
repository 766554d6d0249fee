"""An engine pod's init container: the model folder (and its LoRA adapters) from the registry's artifacts.

    python -m serving.llm.kube.fetch_model --into /models --artifact SHA [--adapter DIR=SHA ...]

leaves ``/models/model`` (the folder vLLM's ``--model`` names) and ``/models/adapters/DIR``: links into the
unpacked archives. The download is the workers' own (serving/artifact_client.py: the worker token, the
content hash checked); a failure exits non-zero with one line saying why, which the pod's status shows and
the launcher reports (kubelet retries the init container meanwhile).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import httpx

from serving.artifact_client import ArtifactFetcher
from serving.settings import CommonSettings


def fetch(into: Path, artifact: str, adapters: dict[str, str], control_plane_url: str) -> None:
    fetcher = ArtifactFetcher(control_plane_url, into / ".artifacts")
    from preprocess.loader import unpack_tokenizer as unpack_once  # a folder travels as a tar, unpacked once

    _link(unpack_once(fetcher.path(artifact), into / ".unpacked"), into / "model")
    for folder, sha in sorted(adapters.items()):
        (into / "adapters").mkdir(parents=True, exist_ok=True)
        _link(unpack_once(fetcher.path(sha), into / ".unpacked"), into / "adapters" / folder)


def _link(target: Path, link: Path) -> None:
    tmp = link.with_name(f".{link.name}.new")
    if tmp.is_symlink():
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, link)  # a restarted init container finds the folder already there


def _adapter(text: str) -> tuple[str, str]:
    folder, _, sha = text.partition("=")
    if not folder or not sha:
        raise argparse.ArgumentTypeError(f"{text!r} is not DIR=SHA256")
    return folder, sha


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--into", type=Path, required=True)
    parser.add_argument("--artifact", required=True)
    parser.add_argument("--adapter", type=_adapter, action="append", default=[])
    args = parser.parse_args(argv)
    url = CommonSettings().control_plane_url
    try:
        fetch(args.into, args.artifact, dict(args.adapter), url)
    except (httpx.HTTPError, OSError, ValueError) as exc:
        print(f"cannot fetch the model folder from {url}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"model folder ready at {args.into / 'model'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tokenizer archives unpack to plain files inside their folder, with or without tarfile's data filter
(Python 3.11.4+; Debian 12's python3.11, which the image is built on, is 3.11.2)."""
from __future__ import annotations

import io
import tarfile

import pytest

from preprocess import loader
from preprocess.user_code import UserCodeError


def evil_archive(path, name: str = "../evil.txt"):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 3
        tar.addfile(info, io.BytesIO(b"bad"))
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("has_data_filter", [True, False])
def test_plain_files_unpack_and_escapes_are_refused(tmp_path, monkeypatch, has_data_filter):
    if not has_data_filter:
        monkeypatch.delattr(tarfile, "data_filter")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "vocab.txt").write_text("[PAD]\n")
    archive = tmp_path / "tok.tar.gz"
    archive.write_bytes(loader.pack_directory(tmp_path / "src"))
    out = loader.unpack_tokenizer(archive, tmp_path / "out")
    assert (out / "vocab.txt").read_text() == "[PAD]\n"
    with pytest.raises((UserCodeError, tarfile.TarError)):
        loader.unpack_tokenizer(evil_archive(tmp_path / "evil.tar.gz"), tmp_path / "out2")
    assert not (tmp_path / "out2" / "evil.txt").exists() and not (tmp_path / "evil.txt").exists()


def test_processes_unpacking_at_once_never_see_a_half_written_file(tmp_path):
    """Worker processes load one config together: each must find the whole tokenizer or none."""
    import multiprocessing

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "tokenizer.json").write_text("x" * 5_000_000)
    archive = tmp_path / "tok.tar.gz"
    archive.write_bytes(loader.pack_directory(tmp_path / "src"))
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        sizes = pool.starmap(_unpack_and_measure, [(archive, tmp_path / "out")] * 8)
    assert sizes == [5_000_000] * 8
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["tok.tar.gz"]  # no temp folders left


def _unpack_and_measure(archive, root) -> int:
    return (loader.unpack_tokenizer(archive, root) / "tokenizer.json").stat().st_size

"""scripts/setup.sh leaves both venvs with their bytecode compiled and current. Where
PYTHONDONTWRITEBYTECODE=1 is set (these machines), nothing else ever writes it, and every engine,
control plane, worker and CLI call would compile what it imports from source: the suite took 43 min
instead of 26 (docs/architecture.md, "The test suite")."""
from __future__ import annotations

import importlib.util
import py_compile
import struct
import subprocess
from pathlib import Path

import pytest

from tests.support.ci import cannot_run

REPO = Path(__file__).resolve().parents[1]
# modules every process of that venv imports, large ones: a venv whose bytecode was never compiled has none
SAMPLES = {
    ".venv": ("torch/__init__.py", "transformers/__init__.py", "fastapi/applications.py", "sqlalchemy/orm/session.py"),
    ".venv-vllm": ("vllm/entrypoints/openai/api_server.py", "vllm/config/model.py", "torch/__init__.py",
                   "transformers/modeling_utils.py"),
}


def site_packages(venv: Path) -> Path:
    out = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, timeout=60)
    return Path(out.stdout.strip())


def stale(source: Path) -> str | None:
    """Why the .pyc Python would load for ``source`` is missing or out of date; None when it is current
    (the header's timestamp and size are those of the source, as importlib checks them)."""
    pyc = Path(importlib.util.cache_from_source(str(source)))
    if not pyc.exists():
        return f"no {pyc}"
    header = pyc.read_bytes()[:16]
    if header[:4] != importlib.util.MAGIC_NUMBER:
        return f"{pyc} is for another Python"
    flags, mtime, size = struct.unpack("<III", header[4:16])
    st = source.stat()
    if flags == 0 and (mtime != int(st.st_mtime) & 0xFFFFFFFF or size != st.st_size & 0xFFFFFFFF):
        return f"{pyc} is older than its source"
    return None


@pytest.mark.parametrize("venv", sorted(SAMPLES))
def test_the_venvs_bytecode_is_compiled(venv):
    path = REPO / venv
    if not (path / "bin" / "python").exists():
        cannot_run(f"no {venv}: run `make setup`")
    site = site_packages(path)
    problems = [why for rel in SAMPLES[venv] if (why := stale(site / rel))]
    assert not problems, "\n".join(problems)


def test_the_check_finds_a_module_with_no_bytecode(tmp_path):
    source = tmp_path / "fresh.py"
    source.write_text("x = 1\n")
    assert "no " in stale(source)
    py_compile.compile(str(source), doraise=True)
    assert stale(source) is None
    source.write_text("x = 22\n")
    assert "older" in stale(source)

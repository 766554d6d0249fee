"""No tracked file holds a secret (issue 17: a generated deploy/.env was once committed).

Reads every file `git ls-files` lists, as a fresh clone would carry it, and fails on:
- a token-shaped value: ``srv_`` followed by hex, the form of the control plane's tokens;
- a non-empty password assignment (``POSTGRES_PASSWORD=...``, ``password: "..."``, a URL with
  ``user:password@``) whose value is a literal rather than a reference (``${VAR}``, a Helm
  expression, a variable), outside ``*.example`` templates;
- a file that only a generator makes (``.env``, private keys, certificates).
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TOKEN = re.compile(r"srv_[0-9a-f]{16,}")
# KEY=value, KEY: value, "key": "value" where the key names a password; the value is captured.
PASSWORD = re.compile(
    r"""(?ix) ["']? [a-z0-9_.-]* (password|passwd) [a-z0-9_.-]* ["']? \s* (:=|[:=]) \s* (?P<value>[^\s#,}]*)""")
URL_CREDENTIALS = re.compile(r"[a-z][a-z0-9+.-]*://[^\s:/@'\"]+:(?P<value>[^\s@/'\"]+)@", re.I)
# A value that names where the secret comes from instead of holding it.
REFERENCE = re.compile(r"""^(["']{2}|\$|\?|\{|%s|\.?[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+\)*$|["']?\$|\{\{|["']?<|None$|null$|(true|false)\b|["']?\*+["']?$|[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+\)*$|[a-z_][a-z0-9_.]*\()""", re.I)
# In Python a bare name is a variable; elsewhere (env files, YAML, shell) it is the value itself.
PYTHON_NAME = re.compile(r"^[a-z_][a-z0-9_]*$", re.I)
GENERATED = re.compile(r"(^|/)(\.env|[^/]*\.(pem|key|crt|p12|pfx)|id_rsa[^/]*|tokens/[^/]+)$")


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, check=True, capture_output=True).stdout
    return [name for name in out.decode().split("\0") if name]


def literal(name: str, value: str) -> bool:
    value = value.strip()
    if name.endswith(".py") and PYTHON_NAME.match(value):
        return False
    return bool(value) and value not in {'""', "''"} | PLACEHOLDERS and not REFERENCE.match(value)


PLACEHOLDERS = {"password", "pass", "secret", "PASSWORD", "{password}"}


def findings(name: str, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if TOKEN.search(line):
            found.append(f"{name}:{number}: token-shaped value (srv_ + hex)")
        if name.endswith(".example") or ("/templates/" in name and "{{" in line):
            continue  # a template, or a Helm expression that computes the value
        for pattern in (PASSWORD, URL_CREDENTIALS):
            for match in pattern.finditer(line):
                if literal(name, match.group("value")):
                    found.append(f"{name}:{number}: password with a literal value")
    return found


def test_no_tracked_file_holds_a_secret():
    problems = []
    for name in tracked_files():
        if name == "tests/test_no_secrets.py":
            continue  # this file's patterns describe secrets without holding one
        if GENERATED.search(name) and not name.endswith(".example"):
            problems.append(f"{name}: a generated secret file is tracked")
        path = REPO / name
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue
        problems += findings(name, data.decode("utf-8", "replace"))
    assert not problems, "secrets in tracked files:\n" + "\n".join(problems)


def test_generated_env_is_ignored():
    assert "deploy/.env" not in tracked_files()
    ignored = subprocess.run(["git", "check-ignore", "-q", "deploy/.env"], cwd=REPO)
    assert ignored.returncode == 0, "deploy/.env must be git-ignored"


@pytest.mark.parametrize("line", [
    "SERVING_ADMIN_TOKEN=srv_0123456789abcdef0123456789abcdef",
    "POSTGRES_PASSWORD=hunter2hunter2",
    '  password: "s3cret"',
    '{"admin_password": "s3cret"}',
    "SERVING_DATABASE_URL=postgresql://serving:s3cret@db/serving",
])
def test_the_check_finds_secrets(line):
    assert findings("deploy/settings.conf", line), line


@pytest.mark.parametrize("line", [
    "POSTGRES_PASSWORD: ${POSTGRES_PASSWORD:?run deploy/init-env.sh}",
    '    password: ""',
    "  {{- $password := .Values.postgresql.auth.password }}",
    "POSTGRES_PASSWORD=",
    "password = settings.database_password",
    "cfg = alembic_config(engine.url.render_as_string(hide_password=False))",
])
def test_the_check_leaves_references(line):
    assert not findings("deploy/settings.conf", line), line

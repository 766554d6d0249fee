"""A real PostgreSQL for the tests: Debian's server binaries run as a throwaway cluster.

Set SERVING_TEST_POSTGRES_URL to use an existing server instead.
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from typing import Iterator

import psycopg

from tests.support.procs import free_port


def pg_bindir() -> str | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(found[-1]) if found else None


def _as_postgres(cmd: list[str]) -> list[str]:
    """initdb refuses to run as root; Debian's package gives us the `postgres` user."""
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yield an admin URL of a running server (postgresql+psycopg://...)."""
    given = os.environ.get("SERVING_TEST_POSTGRES_URL")
    if given:
        yield given
        return
    bindir = pg_bindir()
    if bindir is None:
        raise RuntimeError("PostgreSQL server binaries not found: apt-get install postgresql")
    data = tempfile.mkdtemp(prefix="serving-pg-")
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(data, pw.pw_uid, pw.pw_gid)
    port = free_port()
    subprocess.run(_as_postgres([f"{bindir}/initdb", "-D", data, "-U", "serving", "--auth=trust", "-E", "UTF8"]),
                   check=True, capture_output=True)
    opts = f"-p {port} -k {data} -c listen_addresses=127.0.0.1 -c fsync=off"
    subprocess.run(_as_postgres([f"{bindir}/pg_ctl", "-D", data, "-o", opts, "-l", f"{data}/log", "-w", "start"]),
                   check=True, capture_output=True)
    url = f"postgresql+psycopg://serving@127.0.0.1:{port}/postgres"
    try:
        _wait(url)
        yield url
    finally:
        subprocess.run(_as_postgres([f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"]), capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


def _wait(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(url.replace("+psycopg", "")).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def create_database(admin_url: str, name: str) -> str:
    with psycopg.connect(admin_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return admin_url.rsplit("/", 1)[0] + f"/{name}"

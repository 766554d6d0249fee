"""deploy/init-env.sh: fresh secrets per clone, the once-published ones replaced, and the gateway's
TLS certificate (self-signed with a CA of its own, or the user's, left as is).

The published file is read back from the commit that tracked it (46a9e89), so the test uses the
real leaked values without the repository's tip holding them.
"""
from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import pytest

from tests.deploy.artifacts import DEPLOY, REPO

SECRET_KEYS = ("POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD", "SERVING_ADMIN_TOKEN", "SERVING_WORKER_TOKEN")
LEAKED_IN = "46a9e89"


def env_values(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {key: value for key, value in pairs}


@pytest.fixture
def deploy_dir(tmp_path) -> Path:
    shutil.copy(DEPLOY / "init-env.sh", tmp_path / "init-env.sh")
    shutil.copy(DEPLOY / ".env.example", tmp_path / ".env.example")
    return tmp_path


def run_init(deploy_dir: Path, *names: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(deploy_dir / "init-env.sh"), *names], capture_output=True, text=True, check=True)


def test_fresh_secrets_each_time(deploy_dir, tmp_path_factory):
    run_init(deploy_dir)
    first = env_values(deploy_dir / ".env")
    other = tmp_path_factory.mktemp("other")
    shutil.copy(deploy_dir / "init-env.sh", other)
    shutil.copy(deploy_dir / ".env.example", other)
    run_init(other)
    second = env_values(other / ".env")
    for key in SECRET_KEYS:
        assert first[key] and first[key] != second[key], key
    assert (deploy_dir / ".env").stat().st_mode & 0o777 == 0o600
    kept = run_init(deploy_dir)  # an .env of its own is left alone
    assert "leaving it" in kept.stdout and env_values(deploy_dir / ".env") == first


def test_published_env_is_moved_aside_and_replaced(deploy_dir):
    shown = subprocess.run(["git", "show", f"{LEAKED_IN}:deploy/.env"], cwd=REPO, capture_output=True, text=True)
    assert shown.returncode == 0, f"the history holding the published deploy/.env is needed: {shown.stderr}"
    (deploy_dir / ".env").write_text(shown.stdout)
    published = env_values(deploy_dir / ".env")

    result = run_init(deploy_dir)

    assert "once published in the repository" in result.stderr
    assert all(key in result.stderr for key in SECRET_KEYS)
    fresh = env_values(deploy_dir / ".env")
    for key in SECRET_KEYS:
        assert fresh[key] != published[key], key
    (moved,) = deploy_dir.glob(".env.published-*")
    assert env_values(moved) == published
    assert moved.stat().st_mode & 0o777 == 0o600


# --- the gateway's TLS certificate ---------------------------------------------------------

def handshake(tls_dir: Path, server_name: str, address: str = "127.0.0.1") -> str:
    """A real TLS handshake: a server on loopback with the generated certificate and key, a
    client trusting only the generated CA (strict X.509 checks) and asking for server_name.
    Returns the negotiated protocol; raises ssl.SSLCertVerificationError when it does not verify."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(tls_dir / "server.crt", tls_dir / "server.key")
    client_ctx = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    client_ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_server((address, 0)) as listener:
        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server_ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.recv(1)
            except (ssl.SSLError, OSError):
                pass  # the client refused the certificate

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        try:
            with socket.create_connection(listener.getsockname()[:2], timeout=10) as raw:
                with client_ctx.wrap_socket(raw, server_hostname=server_name) as tls:
                    return tls.version()
        finally:
            thread.join(10)


def test_a_self_signed_certificate_for_localhost_and_the_given_names(deploy_dir):
    result = run_init(deploy_dir, "models.example.com", "10.0.0.7")

    tls_dir = deploy_dir / "tls"
    assert sorted(p.name for p in tls_dir.iterdir()) == ["ca.crt", "server.crt", "server.key"]
    assert (tls_dir / "server.key").stat().st_mode & 0o777 == 0o600
    assert "clients trust deploy/tls/ca.crt" in result.stdout
    for name in ("localhost", "127.0.0.1", "models.example.com", "10.0.0.7"):
        assert handshake(tls_dir, name) in {"TLSv1.2", "TLSv1.3"}, name
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(tls_dir, "other.example.com")
    # the CA's key was only a temporary file: nothing here can sign another certificate
    assert not [p for p in deploy_dir.rglob("*") if p.is_file() and p.name != "server.key"
                and b"PRIVATE KEY" in p.read_bytes()]


def test_each_run_has_a_ca_of_its_own_and_an_existing_certificate_is_kept(deploy_dir, tmp_path_factory):
    run_init(deploy_dir)
    other = tmp_path_factory.mktemp("other")
    shutil.copy(deploy_dir / "init-env.sh", other)
    shutil.copy(deploy_dir / ".env.example", other)
    run_init(other)
    assert (deploy_dir / "tls" / "ca.crt").read_bytes() != (other / "tls" / "ca.crt").read_bytes()
    with pytest.raises(ssl.SSLCertVerificationError):  # one clone's CA does not vouch for another's server
        _cross_check(deploy_dir / "tls", other / "tls")
    before = {p.name: p.read_bytes() for p in (deploy_dir / "tls").iterdir()}
    again = run_init(deploy_dir)
    assert "leaving them" in again.stdout
    assert {p.name: p.read_bytes() for p in (deploy_dir / "tls").iterdir()} == before


def _cross_check(ca_dir: Path, server_dir: Path) -> None:
    mixed = server_dir.parent / "mixed"
    mixed.mkdir()
    shutil.copy(ca_dir / "ca.crt", mixed / "ca.crt")
    shutil.copy(server_dir / "server.crt", mixed / "server.crt")
    shutil.copy(server_dir / "server.key", mixed / "server.key")
    handshake(mixed, "localhost")


def test_a_certificate_brought_by_the_user_is_used_as_is(deploy_dir):
    theirs = deploy_dir / "theirs"
    theirs.mkdir()
    (theirs / "gateway.pem").write_text("their certificate\n")
    (theirs / "gateway-key.pem").write_text("their key\n")
    example = (deploy_dir / ".env.example").read_text()
    example = example.replace("GATEWAY_TLS_CERT=./tls/server.crt", "GATEWAY_TLS_CERT=./theirs/gateway.pem")
    (deploy_dir / ".env.example").write_text(
        example.replace("GATEWAY_TLS_KEY=./tls/server.key", "GATEWAY_TLS_KEY=./theirs/gateway-key.pem"))

    result = run_init(deploy_dir)

    assert "leaving them" in result.stdout
    assert not (deploy_dir / "tls").exists()
    assert (theirs / "gateway.pem").read_text() == "their certificate\n"


def test_half_a_certificate_is_refused(deploy_dir):
    (deploy_dir / "tls").mkdir()
    (deploy_dir / "tls" / "server.crt").write_text("a certificate without its key\n")
    result = subprocess.run(["sh", str(deploy_dir / "init-env.sh")], capture_output=True, text=True)
    assert result.returncode != 0
    assert "only one of ./tls/server.crt and ./tls/server.key exists" in result.stderr


def test_a_malformed_host_name_is_refused(deploy_dir):
    result = subprocess.run(["sh", str(deploy_dir / "init-env.sh"), "models.example.com,IP:1.2.3.4"],
                            capture_output=True, text=True)
    assert result.returncode != 0 and "not a host name or IP address" in result.stderr
    assert not (deploy_dir / "tls" / "server.crt").exists()


def test_the_generated_files_are_git_ignored():
    for name in ("deploy/tls/server.key", "deploy/tls/server.crt", "deploy/tls/ca.crt"):
        ignored = subprocess.run(["git", "check-ignore", "-q", name], cwd=REPO)
        assert ignored.returncode == 0, f"{name} must be git-ignored"

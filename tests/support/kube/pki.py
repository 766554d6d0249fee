"""The cluster's certificates, made with openssl in the cluster's temporary directory.

One CA signs the API server's serving certificate (valid for the node's IP, the first Service IP
and the usual in-cluster names) and one client certificate in group system:masters, which the
tests, the controllers, kubelet and kube-proxy all use: this is a throwaway cluster whose only
users are the test session, so per-component identities would add nothing that is tested.
Nothing here is ever written into the repository.
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "2"


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    sa_key: Path      # signs service-account tokens (controller-manager)
    sa_pub: Path      # verifies them (API server)
    front_proxy_ca: Path    # the aggregation layer's: what an aggregated API server checks the API server's
    front_proxy_cert: Path  # requests by (the API server's client certificate when it proxies to one)
    front_proxy_key: Path


def _openssl(*args: str) -> None:
    out = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args[:2])} failed: {out.stderr[-800:]}")


def make_pki(root: Path, node_ip: str, service_ip: str) -> Pki:
    """Write a CA, the API server's certificate and an admin client certificate under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    p = lambda name: root / name  # noqa: E731
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", "/CN=serving-test-ca",
             "-keyout", str(p("ca.key")), "-out", str(p("ca.crt")))
    sans = ",".join([f"IP:{node_ip}", f"IP:{service_ip}", "IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes",
                     "DNS:kubernetes.default", "DNS:kubernetes.default.svc",
                     "DNS:kubernetes.default.svc.cluster.local"])
    p("server.ext").write_text(f"subjectAltName={sans}\nextendedKeyUsage=serverAuth\n")
    p("client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subj, ext in (("server", "/CN=kube-apiserver", "server.ext"),
                            ("client", "/O=system:masters/CN=serving-test-admin", "client.ext")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subj,
                 "-keyout", str(p(f"{name}.key")), "-out", str(p(f"{name}.csr")))
        _openssl("x509", "-req", "-in", str(p(f"{name}.csr")), "-CA", str(p("ca.crt")), "-CAkey", str(p("ca.key")),
                 "-CAcreateserial", "-days", DAYS, "-extfile", str(p(ext)), "-out", str(p(f"{name}.crt")))
    # a CA of its own, as kubeadm makes it: a certificate of the cluster's CA must not pass as the proxy's
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", DAYS, "-subj", "/CN=serving-test-front-proxy-ca",
             "-keyout", str(p("front-proxy-ca.key")), "-out", str(p("front-proxy-ca.crt")))
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=front-proxy-client",
             "-keyout", str(p("front-proxy-client.key")), "-out", str(p("front-proxy-client.csr")))
    _openssl("x509", "-req", "-in", str(p("front-proxy-client.csr")), "-CA", str(p("front-proxy-ca.crt")),
             "-CAkey", str(p("front-proxy-ca.key")), "-CAcreateserial", "-days", DAYS, "-extfile", str(p("client.ext")),
             "-out", str(p("front-proxy-client.crt")))
    _openssl("genrsa", "-out", str(p("sa.key")), "2048")
    _openssl("rsa", "-in", str(p("sa.key")), "-pubout", "-out", str(p("sa.pub")))
    return Pki(ca=p("ca.crt"), server_cert=p("server.crt"), server_key=p("server.key"),
               client_cert=p("client.crt"), client_key=p("client.key"), sa_key=p("sa.key"), sa_pub=p("sa.pub"),
               front_proxy_ca=p("front-proxy-ca.crt"), front_proxy_cert=p("front-proxy-client.crt"),
               front_proxy_key=p("front-proxy-client.key"))


def kubeconfig(pki: Pki, server: str, path: Path) -> Path:
    """A kubeconfig for ``server`` with the admin client certificate."""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {{certificate-authority: {pki.ca}, server: "{server}"}}
users:
- name: admin
  user: {{client-certificate: {pki.client_cert}, client-key: {pki.client_key}}}
contexts:
- name: test
  context: {{cluster: test, user: admin}}
current-context: test
""")
    return path

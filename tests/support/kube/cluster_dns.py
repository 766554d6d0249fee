"""A cluster-DNS stand-in for CoreDNS (there is no CoreDNS here): ``<svc>.<ns>.svc.<domain>`` A records
read from the API server.

Pods resolve Service names through the name server kubelet writes into their resolv.conf
(``--cluster-dns``); the cluster fixture points that at a ``kube-dns`` Service whose endpoint is
this process on the node. It answers what the chart needs and nothing more:

- a Service with a ClusterIP: that IP;
- a headless Service (``clusterIP: None``): every ready address of its Endpoints, re-read as pods
  come and go (the API is read again when the cached copy is older than ``--refresh`` seconds);
- ``<pod-hostname>.<svc>.<ns>.svc.<domain>`` for an Endpoints address with a hostname (StatefulSets);
- any other name: NXDOMAIN (no upstream: pods here reach nothing outside the cluster).

Run: ``python -m tests.support.kube.cluster_dns --server URL --ca CA --cert CRT --key KEY
--listen IP:PORT`` (UDP and TCP on the same port).
"""
from __future__ import annotations

import argparse
import signal
import ssl
import sys
import threading
import time

import httpx
from dnslib import QTYPE, RCODE, RR, A
from dnslib.server import BaseResolver, DNSLogger, DNSServer

TTL = 5


class ApiView:
    """Services and Endpoints of every namespace, read from the API at most every ``refresh`` s."""

    def __init__(self, client: httpx.Client, refresh: float) -> None:
        self.client, self.refresh = client, refresh
        self.lock = threading.Lock()
        self.read_at = 0.0
        self.names: dict[str, list[str]] = {}

    def lookup(self, name: str, domain: str) -> list[str] | None:
        """A name not known yet, or known without addresses, is looked up afresh (at most 10 reads a
        second): a Service created a moment ago resolves at once, as with CoreDNS's watch."""
        with self.lock:
            age = time.monotonic() - self.read_at
            if age > self.refresh or (not self.names.get(name) and age > 0.1):
                self.names = self._read(domain)
                self.read_at = time.monotonic()
            return self.names.get(name)

    def _read(self, domain: str) -> dict[str, list[str]]:
        services = self.client.get("/api/v1/services").raise_for_status().json()["items"]
        endpoints = self.client.get("/api/v1/endpoints").raise_for_status().json()["items"]
        ready: dict[tuple[str, str], list[dict]] = {}
        for ep in endpoints:
            key = (ep["metadata"]["namespace"], ep["metadata"]["name"])
            ready[key] = [a for s in ep.get("subsets") or [] for a in s.get("addresses") or []]
        names: dict[str, list[str]] = {}
        for svc in services:
            ns, svc_name = svc["metadata"]["namespace"], svc["metadata"]["name"]
            fqdn = f"{svc_name}.{ns}.svc.{domain}."
            addresses = ready.get((ns, svc_name), [])
            cluster_ip = svc["spec"].get("clusterIP")
            if cluster_ip and cluster_ip != "None":
                names[fqdn] = [cluster_ip]
            else:
                names[fqdn] = sorted({a["ip"] for a in addresses})
            for a in addresses:
                if a.get("hostname"):
                    names[f"{a['hostname']}.{fqdn}"] = [a["ip"]]
        return names


class Resolver(BaseResolver):
    def __init__(self, view: ApiView, domain: str) -> None:
        self.view, self.domain = view, domain

    def resolve(self, request, handler):
        reply = request.reply()
        qname, qtype = str(request.q.qname).lower(), request.q.qtype
        try:
            ips = self.view.lookup(qname, self.domain)
        except httpx.HTTPError as exc:
            print(f"cannot read the API: {exc!r}", file=sys.stderr, flush=True)
            reply.header.rcode = RCODE.SERVFAIL
            return reply
        if ips is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif qtype in (QTYPE.A, QTYPE.ANY):
            for ip in ips:
                reply.add_answer(RR(request.q.qname, QTYPE.A, rdata=A(ip), ttl=TTL))
        # a known name asked for AAAA (or anything else): NOERROR with no answer, so that resolvers
        # take the A records rather than failing the whole lookup
        return reply


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--listen", required=True, help="IP:PORT")
    ap.add_argument("--domain", default="cluster.local")
    ap.add_argument("--refresh", type=float, default=1.0)
    args = ap.parse_args()
    host, port = args.listen.rsplit(":", 1)
    # trust_env=False: a proxy set for the machine's way out must not be asked for the node's own address
    tls = ssl.create_default_context(cafile=args.ca)
    tls.load_cert_chain(args.cert, args.key)
    client = httpx.Client(base_url=args.server, verify=tls, timeout=10, trust_env=False)
    resolver = Resolver(ApiView(client, args.refresh), args.domain.strip("."))
    quiet = DNSLogger(log="-request,-reply,-truncated,-data,-recv,-send", prefix=False)  # errors only
    servers = [DNSServer(resolver, address=host, port=int(port), tcp=tcp, logger=quiet) for tcp in (False, True)]
    for s in servers:
        s.start_thread()
    print(f"cluster DNS stand-in answering on {args.listen} (UDP, TCP)", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    done.wait()
    for s in servers:
        s.stop()


if __name__ == "__main__":
    main()

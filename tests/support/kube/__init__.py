"""A real single-node Kubernetes (v1.20.2, built by scripts/kube-build.sh) for the tests: see cluster.py."""

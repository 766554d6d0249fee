# The two commands the README opens with. Both run the set-up first (idempotent).
.PHONY: setup demo test bench kube

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/serving demo

# The tests install the Helm chart on a real Kubernetes (tests/deploy/kube): built once per machine into
# ~/.cache/serving-kube (SERVING_KUBE_CACHE) by scripts/kube-build.sh, about 6-8 minutes the first time,
# instant afterwards. `demo` never needs it.
kube:
	@bash scripts/kube-build.sh

test: setup kube
	.venv/bin/python -m pytest -q -n 3 --no-loadscope-reorder --durations=40

bench: setup
	.venv/bin/python -m benchmarks.run --quick

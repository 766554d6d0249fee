# The two commands the README opens with. Both run the set-up first (idempotent).
.PHONY: setup demo test bench

setup:
	@bash scripts/setup.sh

demo: setup
	.venv/bin/serving demo

test: setup
	.venv/bin/python -m pytest -q --durations=25

bench: setup
	.venv/bin/python -m benchmarks.run --quick

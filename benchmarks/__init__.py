"""Benchmarks of this platform against the alternatives users compare it with.

``python -m benchmarks.run`` runs every system on the same corpus, on the same
machine, in one go, so the ratios it reports (against the in-process ceiling and
against the plain FastAPI baseline) are comparable. See docs/benchmarks.md.
"""

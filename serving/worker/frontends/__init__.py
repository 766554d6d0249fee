"""Thin protocol adapters over :mod:`serving.worker.dataplane`."""

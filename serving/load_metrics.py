"""The names of a worker's load on its ``GET /metrics``: the worker writes them (serving/worker/load.py),
the control plane reads them for the HPAs (registry/autoscaling/catalogue.py). One contract, here."""

IN_FLIGHT = "serving_worker_requests_in_flight"
PROCESSES = "serving_worker_processes"

"""Autoscaling on the platform's own signals, with Kubernetes' stock HorizontalPodAutoscaler.

The control plane samples the signals (catalogue.py: the workers' requests in flight, Triton's queue, the
LLM engines' waiting requests, KV-cache use and time to first token, read from the pods: pod_metrics.py) and
serves them as the external metrics API, ``external.metrics.k8s.io/v1beta1``, on a TLS port of its
own that the API server's aggregation layer proxies to (metrics_api.py; the API server's client
certificate is checked against the cluster's front-proxy CA: serve.py). Nothing else to
install: no metrics-server, no Prometheus adapter, no KEDA. docs/deploy-helm.md#autoscaling.
"""

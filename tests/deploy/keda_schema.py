"""KEDA's ScaledObject and TriggerAuthentication (keda.sh/v1alpha1, KEDA 2.x) as JSON schemas, written here from
KEDA's documented CRD fields: kubernetes-validate has no schema for custom resources. Strict where the CRD is
(unknown fields refused), and ``metadata`` of a trigger a map of strings, as the CRD types it: a number
there is refused by the API server, a mistake a template makes easily."""
from __future__ import annotations

STRINGS = {"type": "object", "additionalProperties": {"type": "string"}}
META = {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}

SCALED_OBJECT = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "ScaledObject"}, "metadata": META,
        "spec": {"type": "object", "additionalProperties": False, "required": ["scaleTargetRef", "triggers"],
                 "properties": {
                     "scaleTargetRef": {"type": "object", "additionalProperties": False, "required": ["name"],
                                        "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                                       "name": {"type": "string"},
                                                       "envSourceContainerName": {"type": "string"}}},
                     "pollingInterval": {"type": "integer", "minimum": 1},
                     "cooldownPeriod": {"type": "integer", "minimum": 0},
                     "initialCooldownPeriod": {"type": "integer", "minimum": 0},
                     "idleReplicaCount": {"type": "integer", "minimum": 0},
                     "minReplicaCount": {"type": "integer", "minimum": 0},
                     "maxReplicaCount": {"type": "integer", "minimum": 1},
                     "fallback": {"type": "object", "additionalProperties": False,
                                  "properties": {"failureThreshold": {"type": "integer"}, "replicas": {"type": "integer"}}},
                     "advanced": {"type": "object", "additionalProperties": False, "properties": {
                         "restoreToOriginalReplicaCount": {"type": "boolean"},
                         "horizontalPodAutoscalerConfig": {"type": "object", "additionalProperties": False, "properties": {
                             "name": {"type": "string"}, "behavior": {"type": "object"}}},
                         "scalingModifiers": {"type": "object"}}},
                     "triggers": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["type", "metadata"],
                         "properties": {
                             "type": {"type": "string"}, "name": {"type": "string"}, "metadata": STRINGS,
                             "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                             "useCachedMetrics": {"type": "boolean"},
                             "authenticationRef": {"type": "object", "additionalProperties": False, "required": ["name"],
                                                   "properties": {"name": {"type": "string"},
                                                                  "kind": {"enum": ["TriggerAuthentication",
                                                                                    "ClusterTriggerAuthentication"]}}}}}}}}},
}

TRIGGER_AUTHENTICATION = {
    "type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"}, "kind": {"const": "TriggerAuthentication"}, "metadata": META,
        "spec": {"type": "object", "properties": {
            "secretTargetRef": {"type": "array", "items": {
                "type": "object", "additionalProperties": False, "required": ["parameter", "name", "key"],
                "properties": {"parameter": {"type": "string"}, "name": {"type": "string"}, "key": {"type": "string"}}}},
            "env": {"type": "array"}, "podIdentity": {"type": "object"}, "hashiCorpVault": {"type": "object"}},
            "additionalProperties": False}},
}

# KEDA's metrics-api scaler: the metadata keys it reads (the rest are refused by the scaler at runtime)
METRICS_API_KEYS = {"url", "valueLocation", "targetValue", "activationTargetValue", "format", "authMode", "unsafeSsl"}

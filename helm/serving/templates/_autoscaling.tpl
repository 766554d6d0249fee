{{/* HorizontalPodAutoscalers on the platform's own signals (registry/autoscaling/catalogue.py), served by the
     control plane's external metrics API (metrics-api.yaml), for the workers, Triton and the LLM engine.

     serving.hpa (list . component autoscalingValues signals): an HPA for the component's Deployment. signals:
     a list of (list externalMetricName targetType value) for the values set (null: left out; targetType
     AverageValue: per replica; Value: the whole), plus CPU and memory utilization when their values are set.
     Fails the render naming what is missing: a signal, or metricsApi for an external one. */}}
{{- define "serving.hpa" -}}
{{- $root := index . 0 }}{{- $component := index . 1 }}{{- $a := index . 2 }}{{- $signals := index . 3 }}
{{- $metrics := list }}
{{- range $signals }}
{{- $value := index . 2 }}
{{- if not (kindIs "invalid" $value) }}
{{- if not $root.Values.metricsApi.enabled }}
{{- fail (printf "%s.autoscaling scales on %s, served by the control plane's external metrics API: set metricsApi.enabled=true (or that value to null and a CPU target)" $component (index . 0)) }}
{{- end }}
{{- $target := eq (index . 1) "Value" | ternary (dict "type" "Value" "value" (toString $value)) (dict "type" "AverageValue" "averageValue" (toString $value)) }}
{{- $metrics = append $metrics (dict "type" "External" "external" (dict "metric" (dict "name" (index . 0)) "target" $target)) }}
{{- end }}
{{- end }}
{{- range $resource := list "cpu" "memory" }}
{{- $value := index $a (printf "target%sUtilizationPercentage" (eq $resource "cpu" | ternary "CPU" "Memory")) }}
{{- if not (kindIs "invalid" $value) }}
{{- $metrics = append $metrics (dict "type" "Resource" "resource" (dict "name" $resource "target" (dict "type" "Utilization" "averageUtilization" $value))) }}
{{- end }}
{{- end }}
{{- if not $metrics }}
{{- fail (printf "%s.autoscaling needs a signal: one of its targets, or targetCPUUtilizationPercentage / targetMemoryUtilizationPercentage" $component) }}
{{- end }}
{{- $name := include "serving.componentName" (list $root $component) }}
apiVersion: {{ include "serving.hpaApiVersion" $root }}
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $name }}
  labels:
    {{- include "serving.labels" (list $root $component) | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicas: {{ $a.minReplicas }}
  maxReplicas: {{ $a.maxReplicas }}
  metrics:
    {{- toYaml $metrics | nindent 4 }}
  {{- with $a.behavior }}
  behavior:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

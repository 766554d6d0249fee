{{/* HorizontalPodAutoscalers on the platform's own signals (registry/autoscaling/catalogue.py), served by the
     control plane's external metrics API (metrics-api.yaml), for the workers, Triton and the LLM engine.

     serving.hpa (list . component autoscalingValues signals): an HPA for the component's Deployment. signals:
     a list of (list externalMetricName targetType value) for the values set (null: left out; targetType
     AverageValue: per replica; Value: the whole), plus CPU and memory utilization when their values are set.
     Fails the render naming what is missing: a signal, or metricsApi for an external one.
     With keda.enabled, a KEDA ScaledObject instead, on the same signals: KEDA's metrics-api trigger reads each
     from the control plane's signals port (registry/autoscaling/signals_http.py) with the worker token. */}}
{{- define "serving.hpa" -}}
{{- $root := index . 0 }}{{- $component := index . 1 }}{{- $a := index . 2 }}{{- $signals := index . 3 }}
{{- $metrics := list }}
{{- range $signals }}
{{- $value := index . 2 }}
{{- if not (kindIs "invalid" $value) }}
{{- if not (or $root.Values.metricsApi.enabled $root.Values.keda.enabled) }}
{{- fail (printf "%s.autoscaling scales on %s, served by the control plane's external metrics API: set metricsApi.enabled=true, or keda.enabled=true where KEDA runs (or that value to null and a CPU target)" $component (index . 0)) }}
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
{{- if $root.Values.keda.enabled }}
{{- include "serving.scaledObject" (list $root $component $a $metrics) }}
{{- else }}
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
{{- end }}

{{/* serving.scaledObject (list . component autoscalingValues hpaMetrics): KEDA's ScaledObject for the
     component's Deployment, one trigger per metric of the HPA it replaces. */}}
{{- define "serving.scaledObject" -}}
{{- $root := index . 0 }}{{- $component := index . 1 }}{{- $a := index . 2 }}{{- $metrics := index . 3 }}
{{- $name := include "serving.componentName" (list $root $component) }}
{{- $signals := printf "http://%s:%v/signals" (include "serving.componentName" (list $root "control-plane")) $root.Values.keda.signalsPort }}
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: {{ $name }}
  labels:
    {{- include "serving.labels" (list $root $component) | nindent 4 }}
spec:
  scaleTargetRef:
    name: {{ $name }}
  minReplicaCount: {{ $a.minReplicas }}
  maxReplicaCount: {{ $a.maxReplicas }}
  pollingInterval: {{ $root.Values.keda.pollingInterval }}
  cooldownPeriod: {{ $root.Values.keda.cooldownPeriod }}
  {{- with $a.behavior }}
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        {{- toYaml . | nindent 8 }}
  {{- end }}
  triggers:
    {{- range $metrics }}
    {{- if eq .type "External" }}
    {{- $target := .external.target }}
    - type: metrics-api
      metricType: {{ $target.type }}
      metadata:
        url: {{ printf "%s/%s" $signals .external.metric.name | quote }}
        valueLocation: value
        targetValue: {{ eq $target.type "Value" | ternary $target.value $target.averageValue | quote }}
        authMode: bearer
      authenticationRef:
        name: {{ include "serving.componentName" (list $root "signals") }}
    {{- else }}
    - type: {{ .resource.name }}
      metricType: Utilization
      metadata:
        value: {{ .resource.target.averageUtilization | quote }}
    {{- end }}
    {{- end }}
{{- end }}

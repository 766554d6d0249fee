{{/* Triton's helpers (triton.yaml, and the Triton settings of configmap.yaml). */}}

{{/* "true" when each Triton pod loads its own models (a sidecar beside NVIDIA's image, or the
     embedded Triton itself), "" when the control plane loads them into the one Triton through its
     Service. triton.modelLoading auto: the control plane with one replica of NVIDIA's image, the
     pods otherwise. Combinations that cannot work fail the render. */}}
{{- define "serving.tritonPerPod" -}}
{{- $t := .Values.triton }}
{{- $mode := $t.modelLoading | default "auto" }}
{{- if and (eq $mode "controlPlane") (gt (int $t.replicas) 1) }}
{{- fail "triton.modelLoading=controlPlane needs triton.replicas=1: the control plane loads models through the Service, which reaches one pod per load; use modelLoading=pod (or auto)" }}
{{- end }}
{{- if and (eq $mode "controlPlane") $t.autoscaling.enabled }}
{{- fail "triton.autoscaling adds pods that must load their own models: triton.modelLoading must be auto or pod" }}
{{- end }}
{{- if and (eq $mode "controlPlane") (eq $t.mode "embedded") }}
{{- fail "triton.mode=embedded loads its own models: triton.modelLoading must be auto or pod" }}
{{- end }}
{{- if or (eq $t.mode "embedded") (eq $mode "pod") (and (eq $mode "auto") (or (gt (int $t.replicas) 1) $t.autoscaling.enabled)) }}
{{- print "true" }}
{{- end }}
{{- end }}

{{/* The headless Service: one DNS address per ready Triton pod, for the workers. */}}
{{- define "serving.tritonPodsName" -}}
{{- printf "%s-pods" (include "serving.componentName" (list . "triton")) }}
{{- end }}

{{/* The workers' SERVING_TRITON_GRPC_URL: with several Triton pods (or an autoscaler that adds them), every
     address of the headless Service (serving/worker/engines/triton_pool.py); with one, the Service as always. */}}
{{- define "serving.tritonGrpcUrl" -}}
{{- if or (gt (int .Values.triton.replicas) 1) .Values.triton.autoscaling.enabled }}
{{- printf "dns:///%s:%v" (include "serving.tritonPodsName" .) .Values.triton.ports.grpc }}
{{- else }}
{{- printf "%s:%v" (include "serving.componentName" (list . "triton")) .Values.triton.ports.grpc }}
{{- end }}
{{- end }}

{{/* The embedded Triton's image (Dockerfile target embedded-triton): triton.embedded.image, by
     default the platform image's repository with "-triton" and its tag. */}}
{{- define "serving.tritonEmbeddedImage" -}}
{{- $img := .Values.triton.embedded.image }}
{{- printf "%s:%s" ($img.repository | default (printf "%s-triton" .Values.image.repository)) ($img.tag | default .Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* Settings of a Triton pod's container of the platform's image (embedded Triton or sidecar). */}}
{{- define "serving.tritonPodEnv" -}}
- name: SERVING_HOME
  value: /var/lib/serving
- name: SERVING_CONTROL_PLANE_URL
  value: {{ include "serving.controlPlaneUrl" . | quote }}
- name: SERVING_TRITON_HOST
  value: 0.0.0.0
- name: SERVING_TRITON_READINESS_PORT
  value: {{ .Values.triton.ports.readiness | quote }}
{{ include "serving.tokenEnv" (list . "SERVING_WORKER_TOKEN" "worker-token") }}
{{- end }}

{{/* Triton from the platform's own image instead of NVIDIA's (triton.embedded: true): the Dockerfile's
     embedded-triton target running `serving triton`, a real tritonserver (from nvidia-pytriton) whose
     python backend serves the registry's ONNX models with onnxruntime, following the control plane's
     config stream. For clusters that cannot pull nvcr.io (the tests' cluster has no registry, as the
     compose stand-ins' Triton, deploy/docker-compose.stand-ins.yml); NVIDIA's image stays the default.
     The control plane still writes /models; its load requests are refused by this Triton and retried. */}}
{{- define "serving.tritonEmbedded" -}}
{{- $ports := .Values.triton.ports -}}
args: ["triton"]
env:
  - name: SERVING_HOME
    value: /var/lib/serving
  - name: SERVING_CONTROL_PLANE_URL
    value: {{ include "serving.controlPlaneUrl" . | quote }}
  {{- include "serving.tokenEnv" (list . "SERVING_WORKER_TOKEN" "worker-token") | nindent 2 }}
  - name: SERVING_TRITON_HOST
    value: 0.0.0.0
  - name: SERVING_TRITON_HTTP_PORT
    value: {{ $ports.http | quote }}
  - name: SERVING_TRITON_GRPC_PORT
    value: {{ $ports.grpc | quote }}
  - name: SERVING_TRITON_METRICS_PORT
    value: {{ $ports.metrics | quote }}
{{- end }}

{{/* The external LLM engine's helpers (llm.yaml). */}}

{{/* The headless Service: one DNS address per ready vLLM pod, for the workers. */}}
{{- define "serving.llmPodsName" -}}
{{- printf "%s-pods" (include "serving.componentName" (list . "llm")) }}
{{- end }}

{{/* The url an endpoint names: every pod through the headless Service with several replicas, the
     Service with one. */}}
{{- define "serving.llmUrl" -}}
{{- if gt (int .Values.llm.replicas) 1 }}
{{- printf "http://%s:%v/v1" (include "serving.llmPodsName" .) .Values.llm.port }}
{{- else }}
{{- printf "http://%s:%v/v1" (include "serving.componentName" (list . "llm")) .Values.llm.port }}
{{- end }}
{{- end }}

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

{{/* The engine pods' template for the control plane's launcher (serving/llm/kube/template.py), as JSON. */}}
{{- define "serving.llmEngineTemplate" -}}
{{- $e := .Values.llmEngines }}
{{- $t := dict "release" (include "serving.fullname" .) "owner" (include "serving.componentName" (list . "control-plane")) "image" (printf "%s:%s" $e.image.repository $e.image.tag) "pullPolicy" $e.image.pullPolicy "python" $e.python "port" $e.port "initImage" (include "serving.image" .) "initPullPolicy" .Values.image.pullPolicy "controlPlaneUrl" (include "serving.controlPlaneUrl" .) "workerToken" (dict "name" (include "serving.tokensSecret" .) "key" "worker-token") "gpus" $e.gpus "resources" $e.resources "nodeSelector" $e.nodeSelector "tolerations" $e.tolerations "extraArgs" $e.extraArgs "kvCacheGb" $e.kvCacheGb "shmSize" $e.shmSize "env" $e.env "startupSeconds" $e.startupSeconds }}
{{- if $e.autoscaling.enabled }}
{{- if not .Values.metricsApi.enabled }}
{{- fail "llmEngines.autoscaling scales each engine on its own signals, served by the control plane's external metrics API: set metricsApi.enabled=true" }}
{{- end }}
{{- $a := omit $e.autoscaling "enabled" }}
{{- $_ := set $a "apiVersion" (include "serving.hpaApiVersion" .) }}
{{- $_ := set $t "autoscaling" $a }}
{{- end }}
{{- toJson $t }}
{{- end }}

{{/* Where workers read the engines' pods: the launcher in the control plane's pod. */}}
{{- define "serving.llmLauncherUrl" -}}
{{- printf "http://%s:%v" (include "serving.componentName" (list . "control-plane")) .Values.llmEngines.launcherPort }}
{{- end }}

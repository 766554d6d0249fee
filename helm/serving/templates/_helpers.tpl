{{/* Names. serving.name: the app.kubernetes.io/name label, the same whatever the release is called.
     serving.fullname: what every object's name starts with: fullnameOverride when set, else
     <release>-serving, or just the release when it is already called serving (`helm install serving`
     gives serving-control-plane, not serving-serving-control-plane); at most 63 characters. */}}
{{- define "serving.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "serving.fullname" -}}
{{- $derived := eq .Release.Name .Chart.Name | ternary .Release.Name (printf "%s-%s" .Release.Name .Chart.Name) }}
{{- .Values.fullnameOverride | default $derived | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of one component's objects: {{ include "serving.componentName" (list . "worker") }} */}}
{{- define "serving.componentName" -}}
{{- $root := index . 0 }}
{{- printf "%s-%s" (include "serving.fullname" $root | trunc 45 | trimSuffix "-") (index . 1) }}
{{- end }}

{{- define "serving.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels (app.kubernetes.io/*) */}}
{{- define "serving.labels" -}}
{{- $root := index . 0 -}}
helm.sh/chart: {{ include "serving.chart" $root }}
{{ include "serving.selectorLabels" . }}
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
app.kubernetes.io/part-of: serving
{{- end }}

{{- define "serving.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "serving.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{- define "serving.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "serving.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "serving.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Where the other components reach the control plane */}}
{{- define "serving.controlPlaneUrl" -}}
{{- printf "http://%s:%v" (include "serving.componentName" (list . "control-plane")) .Values.controlPlane.service.port }}
{{- end }}

{{/* Kafka bootstrap servers, or "" when statistics go over HTTP */}}
{{- define "serving.kafkaBootstrapServers" -}}
{{- if .Values.kafka.enabled }}
{{- printf "%s:9092" (include "serving.componentName" (list . "kafka")) }}
{{- else }}
{{- .Values.externalKafka.bootstrapServers }}
{{- end }}
{{- end }}

{{/* Secret and key holding SERVING_DATABASE_URL, or "" for SQLite on the control plane's volume */}}
{{- define "serving.databaseSecretName" -}}
{{- if .Values.postgresql.enabled }}
{{- include "serving.componentName" (list . "database") }}
{{- else if .Values.externalDatabase.existingSecret }}
{{- .Values.externalDatabase.existingSecret }}
{{- else if .Values.externalDatabase.url }}
{{- include "serving.componentName" (list . "database") }}
{{- end }}
{{- end }}

{{- define "serving.databaseSecretKey" -}}
{{- if and (not .Values.postgresql.enabled) .Values.externalDatabase.existingSecret }}
{{- .Values.externalDatabase.existingSecretKey }}
{{- else }}
{{- print "database-url" }}
{{- end }}
{{- end }}

{{/* Pod-level settings shared by the serving image's pods */}}
{{- define "serving.podCommon" -}}
serviceAccountName: {{ include "serving.serviceAccountName" . }}
{{- /* Service links would inject e.g. SERVING_STATISTICS_PORT=tcp://10.0.0.7:9999 for a
       Service named serving-statistics: the same names as our settings, other meanings. */}}
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end }}

{{/* Volumes every serving container needs with a read-only root filesystem */}}
{{- define "serving.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}

{{/* The Secret holding admin-token and worker-token (auth-secret.yaml, or auth.existingSecret). */}}
{{- define "serving.tokensSecret" -}}
{{- .Values.auth.existingSecret | default (include "serving.componentName" (list . "tokens")) -}}
{{- end }}

{{/* env entries of a token from the tokens Secret: (list . "SERVING_WORKER_TOKEN" "worker-token") */}}
{{- define "serving.tokenEnv" -}}
{{- $root := index . 0 }}
- name: {{ index . 1 }}
  valueFrom:
    secretKeyRef:
      name: {{ include "serving.tokensSecret" $root }}
      key: {{ index . 2 }}
{{- end }}

{{/* API versions that moved after Kubernetes 1.20 (the oldest the chart installs on, tests/deploy/kube):
     HorizontalPodAutoscaler autoscaling/v2 (1.23+, else v2beta2, same fields including behavior) and
     PodDisruptionBudget policy/v1 (1.21+, else v1beta1). On a cluster, APIVersions comes from its
     discovery; `helm template` without one knows every version of Helm's own client, so the Kubernetes
     version (--kube-version) decides there too. */}}
{{- define "serving.hpaApiVersion" -}}
{{- if and (.Capabilities.APIVersions.Has "autoscaling/v2") (semverCompare ">=1.23.0-0" .Capabilities.KubeVersion.Version) -}}
autoscaling/v2
{{- else -}}
autoscaling/v2beta2
{{- end -}}
{{- end }}

{{- define "serving.pdbApiVersion" -}}
{{- if and (.Capabilities.APIVersions.Has "policy/v1") (semverCompare ">=1.21.0-0" .Capabilities.KubeVersion.Version) -}}
policy/v1
{{- else -}}
policy/v1beta1
{{- end -}}
{{- end }}

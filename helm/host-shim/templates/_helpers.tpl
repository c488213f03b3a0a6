{{/* Chart name, truncated to 63 characters. */}}
{{- define "s3dma.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified name; always contains the release name (DPF requires it). */}}
{{- define "s3dma.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "s3dma.selectorLabels" -}}
app.kubernetes.io/name: {{ include "s3dma.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "s3dma.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "s3dma.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: s3dma
{{- end -}}

{{- define "s3dma.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding secret files (existingSecret or the chart's own). */}}
{{- define "s3dma.secretName" -}}
{{- default (printf "%s-secrets" (include "s3dma.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "s3dma.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "s3dma.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Keys the Secret must hold, as a YAML list. */}}
{{- define "s3dma.secretKeys" -}}
{{- $keys := list .Values.fabric.keySecretKey .Values.agent.tokenSecretKey -}}
{{- range $n, $o := .Values.nodes }}{{ if $o.tokenSecretKey }}{{ $keys = append $keys $o.tokenSecretKey }}{{ end }}{{ end -}}
{{- if .Values.agent.tls.enabled }}{{ $keys = append $keys .Values.agent.tls.caSecretKey }}
{{- if .Values.agent.tls.certSecretKey }}{{ $keys = concat $keys (list .Values.agent.tls.certSecretKey .Values.agent.tls.keySecretKey) }}{{ end }}{{ end -}}
{{- toYaml (uniq $keys) -}}
{{- end -}}

{{/* One shim config; called with dict "V" .Values "node" (overrides). */}}
{{- define "s3dma.shimConfig" -}}
{{- $v := .V -}}{{- $n := .node | default dict -}}
{{- $endpoint := $n.agentEndpoint | default $v.agent.endpoint -}}
{{- if and $v.agent.tls.enabled (not (hasPrefix "https://" $endpoint)) -}}
{{- fail (printf "agent.tls.enabled needs an https:// agent endpoint (agent.endpoint / nodes.*.agentEndpoint), not %q" $endpoint) -}}
{{- end -}}
# Rendered by the s3dma host-shim Helm chart.
socket:
  path: {{ printf "/run/s3dma/%s" $v.socket.name | quote }}
  mode: {{ $v.socket.mode | quote }}
  {{- if $v.socket.group }}
  group: {{ $v.socket.group | quote }}
  {{- end }}
agent:
  endpoint: {{ $endpoint | quote }}
  token_file: {{ printf "/etc/s3dma/secrets/%s" ($n.tokenSecretKey | default $v.agent.tokenSecretKey) | quote }}
  {{- if $v.agent.tls.enabled }}
  tls:
    ca_file: {{ printf "/etc/s3dma/secrets/%s" $v.agent.tls.caSecretKey | quote }}
    {{- with $v.agent.tls.serverName }}
    server_name: {{ . | quote }}
    {{- end }}
    {{- if $v.agent.tls.certSecretKey }}
    cert_file: {{ printf "/etc/s3dma/secrets/%s" $v.agent.tls.certSecretKey | quote }}
    key_file: {{ printf "/etc/s3dma/secrets/%s" $v.agent.tls.keySecretKey | quote }}
    {{- end }}
  {{- end }}
  connect_timeout_ms: {{ int $v.agent.connectTimeoutMs }}
  request_timeout_secs: {{ int $v.agent.requestTimeoutSecs }}
  backoff_initial_ms: {{ int $v.agent.backoffInitialMs }}
  backoff_max_ms: {{ int $v.agent.backoffMaxMs }}
fabric:
  backend: {{ $v.fabric.backend | quote }}
  listen: {{ $v.fabric.listen | quote }}
  {{- with ($n.advertise | default $v.fabric.advertise) }}
  advertise: {{ . | quote }}
  {{- end }}
  fabric_key_file: {{ printf "/etc/s3dma/secrets/%s" $v.fabric.keySecretKey | quote }}
tenants:
  {{- toYaml (required "tenants: at least one tenant is required" $v.tenants) | nindent 2 }}
{{- with $v.leases }}
leases:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $v.metrics.enabled }}
metrics:
  address: "0.0.0.0:{{ $v.metrics.port }}"
{{- end }}
{{- end -}}

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
{{- $keys := list -}}
{{- range .Values.users }}{{ $keys = append $keys .secretKey }}{{ end -}}
{{- if .Values.rdma.enabled }}{{ $keys = append $keys .Values.rdma.fabricKeySecretKey }}{{ end -}}
{{- toYaml (uniq $keys) -}}
{{- end -}}

{{/* The chart's name, at most 63 characters (a DNS label). */}}
{{- define "perago-worker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: "<release>-perago-worker", or the release name if it holds the chart's. */}}
{{- define "perago-worker.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "perago-worker.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "perago-worker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "perago-worker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "perago-worker.labels" -}}
helm.sh/chart: {{ include "perago-worker.chart" . }}
{{ include "perago-worker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: worker
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "perago-worker.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "perago-worker.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret the credentials come from: the user's, or the one this chart creates. */}}
{{- define "perago-worker.secretName" -}}
{{- if .Values.credentials.existingSecret }}
{{- .Values.credentials.existingSecret }}
{{- else }}
{{- include "perago-worker.fullname" . }}
{{- end }}
{{- end }}

{{- define "perago-worker.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
SIGKILL comes terminationGracePeriodSeconds after SIGTERM: the drain grace plus a margin for
the worker's own bounded wait after it (see values.yaml, docs/operations.md).
*/}}
{{- define "perago-worker.terminationGracePeriodSeconds" -}}
{{- add (int64 .Values.drain.graceSeconds) (int64 .Values.drain.marginSeconds) }}
{{- end }}

{{/*
Whether a variable name is a credential; such a name never goes into the ConfigMap or a
plain `value:`. The list matches what Settings and conductor-python read (docs/settings.md).
*/}}
{{- define "perago-worker.isCredential" -}}
{{- $known := list "LAKECTL_CREDENTIALS_ACCESS_KEY_ID" "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY" "PERAGO_LAKEFS_ACCESS_KEY_ID" "PERAGO_LAKEFS_SECRET_ACCESS_KEY" "CONDUCTOR_AUTH_KEY" "CONDUCTOR_AUTH_SECRET" "PERAGO_COORD_ACCESS_KEY_ID" "PERAGO_COORD_SECRET_ACCESS_KEY" "AWS_ACCESS_KEY_ID" }}
{{- $upper := upper . }}
{{- if or (has $upper $known) (contains "SECRET" $upper) (contains "PASSWORD" $upper) (contains "TOKEN" $upper) }}true{{ end }}
{{- end }}

{{/* Credential variables: name -> whether the pod may start without it. */}}
{{- define "perago-worker.secretEnv" -}}
{{- $vars := dict "LAKECTL_CREDENTIALS_ACCESS_KEY_ID" false "LAKECTL_CREDENTIALS_SECRET_ACCESS_KEY" false "CONDUCTOR_AUTH_KEY" true "CONDUCTOR_AUTH_SECRET" true }}
{{- if .Values.credentials.existingSecret }}
{{- range .Values.credentials.extraKeys }}
{{- $_ := set $vars . false }}
{{- end }}
{{- else }}
{{- range $name, $_ := .Values.credentials.extra }}
{{- $_ := set $vars $name false }}
{{- end }}
{{- end }}
{{- toJson $vars }}
{{- end }}

{{/* Object-name prefix: <release>-tunehub unless the release name already says tunehub. */}}
{{- define "tunehub.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tunehub.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "tunehub.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tunehub.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" . "component" "hub") */}}
{{- define "tunehub.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tunehub.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tunehub.componentLabels" -}}
{{ include "tunehub.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tunehub.image" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}

{{/* Pod-level security: non-root, RuntimeDefault seccomp. */}}
{{- define "tunehub.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .uid | default 1000 }}
runAsGroup: {{ .gid | default 1000 }}
fsGroup: {{ .gid | default 1000 }}
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "tunehub.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
privileged: false
capabilities:
  drop: ["ALL"]
{{- end -}}

{{- define "tunehub.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "tunehub.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Names shared by templates and the hub config (written into the hub's values Secret). */}}
{{- define "tunehub.dataClaim" -}}
{{- .Values.data.existingClaim | default (printf "%s-data" (include "tunehub.fullname" .)) -}}
{{- end -}}
{{- define "tunehub.priorityClass" -}}
{{- printf "%s-%s" (include "tunehub.fullname" .ctx) .name -}}
{{- end -}}

{{/* Env of the tuner's settings, shared by the hub and the tuner (TUNEHUB_DB_URL from a Secret). */}}
{{- define "tunehub.settingsEnv" -}}
- name: TUNEHUB_MODE
  value: kubernetes
- name: TUNEHUB_HOME
  value: {{ printf "%s/%s" .Values.data.mountPath .Values.data.tunerSubPath | quote }}
- name: TUNEHUB_DATA
  value: {{ .Values.data.mountPath | quote }}
- name: TUNEHUB_REGISTRY
  value: {{ printf "%s/%s" .Values.data.mountPath .Values.data.modelsSubPath | quote }}
{{- if .Values.db.existingSecret }}
- name: TUNEHUB_DB_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.db.existingSecret }}
      key: {{ .Values.db.urlKey }}
{{- end }}
{{- end -}}

{{/* Random secret kept across upgrades: (dict "ctx" . "name" secretName "key" key) */}}
{{- define "tunehub.persistentRandom" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if and $existing (index ($existing.data | default dict) .key) -}}
{{- index $existing.data .key -}}
{{- else -}}
{{- randAlphaNum 64 | b64enc -}}
{{- end -}}
{{- end -}}

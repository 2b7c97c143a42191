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

{{/*
Prefix of cluster-scoped objects (PriorityClasses, Kueue ResourceFlavors and ClusterQueue):
fullname plus a digest of namespace/release, so releases of one name in two namespaces (and
two releases in one) never share, overwrite or delete each other's cluster-wide objects.
*/}}
{{- define "tunehub.clusterPrefix" -}}
{{- printf "%s-%s" (include "tunehub.fullname" .) (sha256sum (printf "%s/%s" .Release.Namespace .Release.Name) | trunc 8) -}}
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
{{/*
The PriorityClass of a role (core, notebook, sweepHigh, sweepNormal, sweepLow): the operator's
existing class, or the chart's <clusterPrefix>-<role>-<value>[-never]. The value (and, for
notebooks, a preemptionPolicy of Never) is in the name because both are immutable: changing
one makes a new class instead of a patch `helm upgrade` would fail on.
(dict "ctx" . "role" "notebook")
*/}}
{{- define "tunehub.priorityClass" -}}
{{- $pc := index .ctx.Values.priorityClasses .role -}}
{{- if $pc.name -}}
{{- $pc.name -}}
{{- else -}}
{{- $never := and (eq .role "notebook") (eq ($pc.preemptionPolicy | default "PreemptLowerPriority") "Never") -}}
{{- printf "%s-%s-%d%s" (include "tunehub.clusterPrefix" .ctx) (.role | kebabcase) (int $pc.value) (ternary "-never" "" $never) -}}
{{- end -}}
{{- end -}}

{{/*
The Kueue WorkloadPriorityClass of a role (notebook, sweepHigh, sweepNormal, sweepLow): always the
chart's own, <clusterPrefix>-<role>-<value> (cluster-scoped), with the role's PriorityClass value,
so Kueue orders notebooks above sweeps and sweeps by priority whatever classes the pods use.
(dict "ctx" . "role" "notebook")
*/}}
{{- define "tunehub.workloadPriorityClass" -}}
{{- $pc := index .ctx.Values.priorityClasses .role -}}
{{- printf "%s-%s-%d" (include "tunehub.clusterPrefix" .ctx) (.role | kebabcase) (int $pc.value) -}}
{{- end -}}

{{/* Kueue names: the created ClusterQueue carries the cluster prefix (namespace and release);
the LocalQueue is namespaced and carries the fullname. */}}
{{- define "tunehub.clusterQueue" -}}
{{- .Values.kueue.existingClusterQueue | default .Values.kueue.clusterQueue | default (include "tunehub.clusterPrefix" .) -}}
{{- end -}}
{{- define "tunehub.localQueue" -}}
{{- .Values.kueue.localQueue | default (include "tunehub.fullname" .) -}}
{{- end -}}

{{/* The Secret holding the proxy and tuner tokens, and its keys. */}}
{{- define "tunehub.tokenSecret" -}}
{{- .Values.hub.existingSecret | default (printf "%s-tokens" (include "tunehub.fullname" .)) -}}
{{- end -}}

{{/* The Secret holding the first admin's password. */}}
{{- define "tunehub.adminSecret" -}}
{{- .Values.auth.admin.existingSecret | default (printf "%s-hub-admin" (include "tunehub.fullname" .)) -}}
{{- end -}}

{{/* True (non-empty) when the hub uses its own local accounts (no other authenticator). */}}
{{- define "tunehub.localAccounts" -}}
{{- $jh := get (.Values.hub.config | default dict) "JupyterHub" | default dict -}}
{{- if not (get $jh "authenticator_class") -}}true{{- end -}}
{{- end -}}

{{/* DNS egress to any destination on the DNS ports (cluster DNS, NodeLocal DNSCache). */}}
{{- define "tunehub.dnsEgress" -}}
- ports:
    {{- range .Values.networkPolicy.dnsPorts }}
    - {protocol: UDP, port: {{ . }}}
    - {protocol: TCP, port: {{ . }}}
    {{- end }}
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
- name: TUNEHUB_USERS_DIR
  value: {{ printf "%s/%s" .Values.data.mountPath .Values.data.usersSubPath | quote }}
- name: TUNEHUB_DB_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "db.existingSecret: name a Secret holding the tuner's PostgreSQL URL" .Values.db.existingSecret }}
      key: {{ .Values.db.urlKey }}
{{- end -}}

{{/* Random secret kept across upgrades: (dict "ctx" . "name" secretName "key" key ["length" n]) */}}
{{- define "tunehub.persistentRandom" -}}
{{- $existing := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if and $existing (index ($existing.data | default dict) .key) -}}
{{- index $existing.data .key -}}
{{- else -}}
{{- randAlphaNum (.length | default 64) | b64enc -}}
{{- end -}}
{{- end -}}

{{/*
A claim's storage class is immutable: an upgrade that changes it would fail halfway on the API
server's refusal. Refuse it before anything is applied, saying what to do instead.
(dict "ctx" . "name" claimName "value" "data.storageClassName" "want" className)
*/}}
{{- define "tunehub.checkClaimClass" -}}
{{- $existing := lookup "v1" "PersistentVolumeClaim" .ctx.Release.Namespace .name -}}
{{- if and $existing .want $existing.spec.storageClassName (ne $existing.spec.storageClassName .want) -}}
{{- fail (printf "%s: the claim %s exists with storage class %q, which cannot change (immutable); keep %q, or copy the data to a new claim and name it in data.existingClaim" .value .name $existing.spec.storageClassName $existing.spec.storageClassName) -}}
{{- end -}}
{{- end -}}

{{/* The toleration of GPU pods (flow style, one line): GPU nodes carry gpuNames.taintKey with
NoSchedule. tunehub_base/gpu_names.py builds the same for notebooks and trial Jobs. */}}
{{- define "tunehub.gpuToleration" -}}
{key: {{ .Values.gpuNames.taintKey | quote }}, operator: Exists, effect: NoSchedule}
{{- end -}}

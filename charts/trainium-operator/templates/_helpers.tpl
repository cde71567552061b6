{{/* Names, labels and small computed values shared by the templates. */}}

{{- define "trainium-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, unless the release name already contains the chart name. */}}
{{- define "trainium-operator.fullname" -}}
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

{{- define "trainium-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; pass a dict with "ctx" (the root context) and "component". */}}
{{- define "trainium-operator.labels" -}}
helm.sh/chart: {{ include "trainium-operator.chart" .ctx }}
{{ include "trainium-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: trainium-operator
{{- end }}

{{- define "trainium-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "trainium-operator.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "trainium-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "trainium-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "trainium-operator.profileUI.fullname" -}}
{{- printf "%s-profile-ui" (include "trainium-operator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Where the namespaced add-ons that TrainingJobs reach by name live. */}}
{{- define "trainium-operator.workloadNamespace" -}}
{{- default .Release.Namespace .Values.workloadNamespace }}
{{- end }}

{{/* "true" when the operator watches every namespace (no watchNamespaces), else "". */}}
{{- define "trainium-operator.clusterWide" -}}
{{- if empty .Values.watchNamespaces }}true{{ end }}
{{- end }}

{{/* Operator replicas: explicit, or 1 standalone / 2 with peering; >1 needs peering. */}}
{{- define "trainium-operator.replicas" -}}
{{- $replicas := .Values.replicaCount }}
{{- if kindIs "invalid" $replicas }}
{{- $replicas = ternary 2 1 .Values.peering.enabled }}
{{- end }}
{{- if and (gt (int $replicas) 1) (not .Values.peering.enabled) }}
{{- fail (printf "replicaCount=%d needs peering.enabled=true: without kopf peering every replica would act on every TrainingJob" (int $replicas)) }}
{{- end }}
{{- int $replicas }}
{{- end }}

{{/* An image reference; pass a dict with "image" (repository/tag/digest) and "default" (tag fallback). */}}
{{- define "trainium-operator.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .default .image.tag) }}
{{- end }}
{{- end }}

{{- define "trainium-operator.operatorImage" -}}
{{- include "trainium-operator.imageRef" (dict "image" .Values.image "default" .Chart.AppVersion) }}
{{- end }}

{{/* Required-during-scheduling node affinity on node.kubernetes.io/instance-type. */}}
{{- define "trainium-operator.instanceTypeAffinity" -}}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
      - matchExpressions:
          - key: node.kubernetes.io/instance-type
            operator: In
            values:
              {{- toYaml . | nindent 14 }}
{{- end }}

{{/*
ServiceAccount of the profile upload pods: the named one, the created one, or none (the job's
own spec.serviceAccountName, else the namespace default).
*/}}
{{- define "trainium-operator.profileUpload.serviceAccountName" -}}
{{- $sa := .Values.profileUpload.serviceAccount -}}
{{- if $sa.name -}}
{{- $sa.name -}}
{{- else if $sa.create -}}
{{- printf "%s-profile-upload" (include "trainium-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
The chart's own ServiceAccounts, as a JSON list of names: no TrainingJob may run as one of them
(the tenancy policy refuses them whatever the author's rights, and the operator refuses them
itself through TRAINIUM_RESERVED_SERVICE_ACCOUNTS). `default` is never listed: it is every
namespace's default account; an operator running as the release namespace's `default` is kept
from jobs because jobs may not run in the release namespace.
*/}}
{{- define "trainium-operator.reservedServiceAccounts" -}}
{{- $names := list (include "trainium-operator.serviceAccountName" .) -}}
{{- if .Values.profileUI.enabled -}}
{{- $names = append $names (include "trainium-operator.profileUI.fullname" .) -}}
{{- end -}}
{{- with (include "trainium-operator.profileUpload.serviceAccountName" .) -}}
{{- $names = append $names . -}}
{{- end -}}
{{- without (uniq $names) "default" | toJson -}}
{{- end -}}

{{/*
The schedulers the operator keeps network topology for (--topology), comma-separated; empty
when topology.enabled is off. Kueue's only with kueue.enabled (the operator then queues jobs
with Kueue, whose CRDs are installed).
*/}}
{{- define "trainium-operator.topologySchedulers" -}}
{{- $schedulers := list }}
{{- if .Values.topology.enabled }}
{{- if .Values.topology.volcano }}
{{- $schedulers = append $schedulers "volcano" }}
{{- end }}
{{- if and .Values.topology.kueue .Values.kueue.enabled }}
{{- $schedulers = append $schedulers "kueue" }}
{{- end }}
{{- end }}
{{- join "," $schedulers }}
{{- end }}

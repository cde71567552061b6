{{/*
The operator's permissions: the ONE list every operator RBAC object of the chart is rendered
from (see rbac.yaml). Each rule carries a scope:
  namespaced - resources in the watched namespaces: rendered into a Role in each watched
               namespace, or into the ClusterRole when the operator watches all namespaces;
  cluster    - cluster-scoped resources (or cluster-wide discovery): always in a ClusterRole.
Least privilege: no wildcards, no Secrets or ConfigMaps, nothing the operator does not call. The
operator never creates Volcano queues, PersistentVolumeClaims or nodes.
*/}}
{{- define "trainium-operator.rbac.operatorRules" -}}
{{- $clusterWide := include "trainium-operator.clusterWide" . -}}
# TrainingJobs: watch them; patch/update for kopf's finalizer and progress annotations.
- scope: namespaced
  apiGroups: ["trainium.dev"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "patch", "update"]
- scope: namespaced
  apiGroups: ["trainium.dev"]
  resources: ["trainingjobs/status"]
  verbs: ["get", "patch", "update"]
# A job's children: worker pods, their headless Service, the Volcano PodGroup of each stage.
- scope: namespaced
  apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- scope: namespaced
  apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "delete"]
- scope: namespaced
  apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Events on TrainingJobs: kopf posts core/v1 Events, the operator events.k8s.io/v1 ones.
- scope: namespaced
  apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
- scope: namespaced
  apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
# Volcano queues: watched read-only, to report a job whose queue is missing or closed (the
# operator never creates or changes a queue).
- scope: cluster
  apiGroups: ["scheduling.volcano.sh"]
  resources: ["queues"]
  verbs: ["list", "watch"]
# Node loss: a job whose node disappears or turns NotReady is restarted.
- scope: cluster
  apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
# kopf: notices CRDs being created or changed while it runs.
- scope: cluster
  apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# What can lift an admission refusal of a job's pod: the operator retries a refused create when
# one of these changes instead of on a timer (read only). Namespaces also carry the Pod Security
# labels; a namespace-bound kopf watches them anyway to notice watched namespaces come and go.
- scope: namespaced
  apiGroups: [""]
  resources: ["resourcequotas", "limitranges", "serviceaccounts"]
  verbs: ["list", "watch"]
- scope: cluster
  apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
- scope: cluster
  apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["list", "watch"]
{{- if .Values.peering.enabled }}
{{- if $clusterWide }}
# kopf peering: keep-alives in the ClusterKopfPeering of a cluster-wide operator.
- scope: cluster
  apiGroups: ["kopf.dev"]
  resources: ["clusterkopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- else }}
# kopf peering: keep-alives in the KopfPeering of each watched namespace.
- scope: namespaced
  apiGroups: ["kopf.dev"]
  resources: ["kopfpeerings"]
  verbs: ["get", "list", "watch", "patch"]
{{- end }}
{{- end }}
{{- end }}

{{/* The profile UI only reads TrainingJobs (the profiles themselves come from the volume). */}}
{{- define "trainium-operator.rbac.profileUIRules" -}}
- scope: namespaced
  apiGroups: ["trainium.dev"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch"]
# `--auth kubernetes`: who a request's bearer token is (TokenReview) and whether that user may
# read a namespace's TrainingJobs (SubjectAccessReview); reviews change nothing in the cluster.
- scope: cluster
  apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
- scope: cluster
  apiGroups: ["authorization.k8s.io"]
  resources: ["subjectaccessreviews"]
  verbs: ["create"]
{{- end }}

{{/*
Render the rules of a list whose scope is in "scopes", without the scope key.
Pass a dict: "rules" (a list from one of the defines above, via fromYamlArray), "scopes".
*/}}
{{- define "trainium-operator.rbac.render" -}}
{{- $scopes := .scopes }}
{{- range $rule := .rules }}
{{- if has $rule.scope $scopes }}
- apiGroups: {{ toJson $rule.apiGroups }}
  resources: {{ toJson $rule.resources }}
  verbs: {{ toJson $rule.verbs }}
{{- end }}
{{- end }}
{{- end }}

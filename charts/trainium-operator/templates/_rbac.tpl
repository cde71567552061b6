{{/*
The operator's permissions: the ONE list every operator RBAC object of the chart is rendered
from (see rbac.yaml). Each rule carries a scope:
  namespaced - resources in the watched namespaces: rendered into a Role in each watched
               namespace, or into the ClusterRole when the operator watches all namespaces;
  cluster    - cluster-scoped resources (or cluster-wide discovery): always in a ClusterRole;
  release    - the operator's own pod: a Role in the release namespace only.
Least privilege: no wildcards, no Secrets or ConfigMaps, nothing the operator does not call. The
operator never creates Volcano queues, PersistentVolumeClaims or nodes; it patches a node
only to cordon a straggler's (spec.health.onStraggler: Replace), and only when the chart's
health.stragglerReplacement.enabled grants it. Kueue's objects are read only with
kueue.enabled (the operator's --kueue), which also grants the one pod patch: lifting Kueue's
finalizer from a pod force-deleted on a lost node.
tests/chart/test_chart_rbac_from_code.py derives from the code (and kopf's documented needs)
what each account calls and fails on a verb granted here that nothing sends, or one missing.
*/}}
{{- define "trainium-operator.rbac.operatorRules" -}}
{{- $clusterWide := include "trainium-operator.clusterWide" . -}}
# TrainingJobs: listed and watched (the cache), read fresh before a status write, deleted when
# ttlSecondsAfterFinished elapses. Only on.event handlers run in kopf: no finalizers or
# progress annotations; the one patch is the removal of a consumed profile-steps annotation.
- scope: namespaced
  apiGroups: ["trainium.dev"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "delete", "patch"]
# The status subresource, written whole (PUT, under the resourceVersion the pass decided on).
- scope: namespaced
  apiGroups: ["trainium.dev"]
  resources: ["trainingjobs/status"]
  verbs: ["update"]
# A job's children: worker pods, their headless Service, the Volcano PodGroup of each stage and
# the NetworkPolicy that admits only the job's own pods (networkPolicy.jobs; watched either way,
# so turning it on needs no new grant). Watched into the cache, read when a name is taken,
# created and deleted; never changed, but for one pod patch, only with kueue.enabled: a pod
# force-deleted on a lost node loses Kueue's finalizer (kueue.x-k8s.io/managed), a
# strategic-merge patch of metadata.finalizers and nothing else.
- scope: namespaced
  apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch", "create", "delete"{{ if .Values.kueue.enabled }}, "patch"{{ end }}]
- scope: namespaced
  apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "delete"]
- scope: namespaced
  apiGroups: ["scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "delete"]
- scope: namespaced
  apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "delete"]
# core/v1 Events on TrainingJobs (the operator's) and kopf's warnings: each is a new Event.
- scope: namespaced
  apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Volcano queues: watched read-only, to report a job whose queue is missing or closed (the
# operator never creates or changes a queue).
- scope: cluster
  apiGroups: ["scheduling.volcano.sh"]
  resources: ["queues"]
  verbs: ["list", "watch"]
{{- if .Values.kueue.enabled }}
# Kueue (kueue.enabled): the Workload of each gang Kueue queues (its admission, its reason for
# waiting or evicting) and the LocalQueues jobs name (missing or stopped), watched read-only;
# Kueue creates both kinds' objects, the operator never writes one.
- scope: namespaced
  apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads", "localqueues"]
  verbs: ["list", "watch"]
{{- end }}
{{- if .Values.dra.enabled }}
# DRA (dra.enabled): the ResourceClaimTemplate of each job with spec.deviceAllocation dra,
# owned by the job (get: to see who owns a name that is taken).
- scope: namespaced
  apiGroups: ["resource.k8s.io"]
  resources: ["resourceclaimtemplates"]
  verbs: ["get", "create"]
{{- end }}
{{- $topology := include "trainium-operator.topologySchedulers" . | splitList "," }}
{{- if has "volcano" $topology }}
# Network topology (topology.enabled, topology.volcano): the HyperNodes the operator writes from
# the nodes' labels, listed by its managed-by labels, created, replaced when their members
# change and deleted when their last node went; never one without those labels.
- scope: cluster
  apiGroups: ["topology.volcano.sh"]
  resources: ["hypernodes"]
  verbs: ["list", "create", "update", "delete"]
{{- end }}
{{- if has "kueue" $topology }}
# Network topology for Kueue (topology.enabled, topology.kueue, kueue.enabled): a Topology and a
# ResourceFlavor per Trainium instance type, listed by the managed-by labels, created, and
# deleted to be created again when their (immutable) spec changed.
- scope: cluster
  apiGroups: ["kueue.x-k8s.io"]
  resources: ["topologies", "resourceflavors"]
  verbs: ["list", "create", "delete"]
{{- end }}
# Node loss: a job whose node disappears or turns NotReady is restarted (nodes are watched).
# patch, only with health.stragglerReplacement.enabled: spec.health.onStraggler: Replace
# cordons a persistent straggler's node (spec.unschedulable, a trainium.dev/cordoned label and
# annotations naming the job and why).
- scope: cluster
  apiGroups: [""]
  resources: ["nodes"]
  verbs: ["list", "watch"{{ if .Values.health.stragglerReplacement.enabled }}, "patch"{{ end }}]
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
{{- if .Values.health.enabled }}
# The health channel: who sent a rank's progress message (TokenReview of its pod-bound,
# audience-bound token); a review changes nothing in the cluster.
- scope: cluster
  apiGroups: ["authentication.k8s.io"]
  resources: ["tokenreviews"]
  verbs: ["create"]
{{- end }}
{{- if and .Values.peering.enabled .Values.health.enabled }}
# The health channel under peering: each replica reads and labels its own pod
# (trainium.dev/health-channel: active or standby), which the health Service selects by; the
# pods of the release namespace only, never a job's.
- scope: release
  apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "patch"]
{{- end }}
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
# `--list-jobs`: lists the TrainingJobs with profiling on, per request (no watch, no get).
- scope: namespaced
  apiGroups: ["trainium.dev"]
  resources: ["trainingjobs"]
  verbs: ["list"]
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

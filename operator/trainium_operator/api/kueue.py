"""Kueue's side of a gang: the labels, annotations and names a Kueue-queued job's pods carry.

A TrainingJob labelled `kueue.x-k8s.io/queue-name: <LocalQueue>` is queued by Kueue as a
**plain pod group** (Kueue's route for a job whose controller is not written in Go): each
stage's gang of one attempt is one group, named after the job, stage and attempt, whose pods
carry the queue, the group's name and its total count. Kueue's pod webhook holds each pod with
its `kueue.x-k8s.io/admission` scheduling gate; once every pod of the group exists Kueue builds
the group's Workload (named after the group) from the pods as they are, admits it whole against
the ClusterQueue's quota, and removes the gates; the kube-scheduler places the pods.

Every pod is marked not retriable in its group: the operator never replaces one rank alone
(torchrun ranks cannot rejoin), it restarts the whole gang as the next attempt, which is a new
group and a new Workload. So a group ends when none of its pods is active, its Workload
finishes and its quota is released, and the next attempt queues afresh.
"""

from __future__ import annotations

import re

from trainium_operator.api.object_names import SUBDOMAIN_PATTERN
from trainium_operator.api.objects import Obj

KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSION = "v1beta2"
# The label that sends a TrainingJob (and its pods) to a LocalQueue of its namespace.
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
# The label naming a WorkloadPriorityClass, on the TrainingJob as on Kueue's own job types.
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
POD_GROUP_NAME_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_TOTAL_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
RETRIABLE_IN_GROUP_ANNOTATION = "kueue.x-k8s.io/retriable-in-group"
# Names the pod label holding the pod's index in its group: Kueue's webhook copies it into
# kueue.x-k8s.io/pod-group-pod-index, by which TAS hands out the topology domains in rank order
# (pkg/controller/jobs/pod/pod_webhook.go, pkg/controller/tas/topology_ungater.go, v0.19.2).
POD_INDEX_LABEL_ANNOTATION = "kueue.x-k8s.io/pod-group-pod-index-label"
# Kueue's finalizer on the pods it manages, and its scheduling gate until admission.
MANAGED_FINALIZER = "kueue.x-k8s.io/managed"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
# The pod condition Kueue sets before it deletes a pod of a Workload it stops (an eviction:
# preemption, a pods-ready timeout, a stopped queue); its reason is "WorkloadEvictedDueTo<why>".
TERMINATION_TARGET_CONDITION = "TerminationTarget"
EVICTED_REASON_PREFIX = "WorkloadEvictedDueTo"
# Kueue's reason for a Workload evicted to make room for a higher-priority one.
PREEMPTED = "Preempted"
# Every label and annotation key under this prefix is Kueue's to read: no job author sets one
# through spec.podMetadata or spec.podTemplate (it would hand a pod to Kueue behind the
# operator's back, or change its group).
RESERVED_PREFIX = "kueue.x-k8s.io/"
# The scheduler that places a Kueue-admitted gang's pods, unless the job names another.
KUBE_SCHEDULER = "default-scheduler"


def group_name(job_name: str, stage: str, attempt: int) -> str:
    """The pod group (and so the Kueue Workload) of one stage's gang of one attempt: at most
    40 + 8 + 1 + 10 characters, within a label value's 63."""
    return f"{job_name}-{stage}-{attempt}"


def pod_labels(queue: str, group: str, priority_class: str | None) -> dict[str, str]:
    labels = {QUEUE_NAME_LABEL: queue, POD_GROUP_NAME_LABEL: group}
    if priority_class:
        labels[PRIORITY_CLASS_LABEL] = priority_class
    return labels


def pod_annotations(total: int) -> dict[str, str]:
    return {
        POD_GROUP_TOTAL_COUNT_ANNOTATION: str(total),
        RETRIABLE_IN_GROUP_ANNOTATION: "false",
    }


def reserved_keys(keys: object) -> list[str]:
    """The keys of a label or annotation map that are Kueue's."""
    if not isinstance(keys, dict):
        return []
    return sorted(str(k) for k in keys if str(k).startswith(RESERVED_PREFIX))


def has_admission_gate(pod: Obj) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(isinstance(g, dict) and g.get("name") == ADMISSION_GATE for g in gates)


def label_problems(labels: object, scheduler_name: str | None) -> list[str]:
    """What is wrong with a TrainingJob's Kueue labels, each naming the label and the fix."""
    if not isinstance(labels, dict):
        return []
    found: list[str] = []
    queue = labels.get(QUEUE_NAME_LABEL)
    priority = labels.get(PRIORITY_CLASS_LABEL)
    for key, value, kind in (
        (QUEUE_NAME_LABEL, queue, "LocalQueue"),
        (PRIORITY_CLASS_LABEL, priority, "WorkloadPriorityClass"),
    ):
        if value is not None and not re.match(SUBDOMAIN_PATTERN, str(value)):
            found.append(
                f"metadata.labels[{key}]: {str(value)[:63]!r} is not a {kind} name (a DNS-1123 "
                "subdomain: lowercase letters, digits, '-' and '.')"
            )
    if priority is not None and queue is None:
        found.append(
            f"metadata.labels[{PRIORITY_CLASS_LABEL}]: only a job Kueue queues (label "
            f"{QUEUE_NAME_LABEL}) has a WorkloadPriorityClass; under Volcano use "
            "spec.scheduling.priorityClassName"
        )
    if queue is not None and scheduler_name == "volcano":
        found.append(
            f"spec.scheduling.schedulerName: volcano cannot place a job Kueue queues (label "
            f"{QUEUE_NAME_LABEL}): Kueue admits the whole gang and the kube-scheduler places "
            "its pods; remove the field"
        )
    return found

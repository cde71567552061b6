"""Pure gang-scheduling decisions with Volcano's observable semantics, over plain API dicts.

Volcano itself cannot be built here (its module is not served by the Go proxy we reach), so the dev
cluster runs this stand-in for pods with `schedulerName: volcano`. It follows what a Volcano user
sees: pods join a PodGroup through the `scheduling.k8s.io/group-name` annotation; nothing of a
group is bound until `minMember` of its pods can be placed at once; PodGroups go Pending ->
Inqueue -> Running -> Completed (Volcano's `jobStatus` rules); unschedulable groups get an
`Unschedulable` condition with reason `NotEnoughResources` and a "N/M tasks in gang
unschedulable: ..." message, and their pods a `FailedScheduling` event and PodScheduled=False.

Placement checks what kube-scheduler's filters check for these pods: requests (extended resources
included) against node allocatable minus the pods already bound, pod count, nodeSelector,
required node affinity, NoSchedule/NoExecute taints against tolerations, node Ready and
schedulable, bound PersistentVolumeClaims. It places first-fit over nodes sorted by name.
Not modelled: preemption, reclaim, queue capacity/deserved shares, pod (anti-)affinity,
topology spread, host ports, priorities.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

SCHEDULER_NAME = "volcano"
GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"
QUEUE_NAME_ANNOTATION = "scheduling.volcano.sh/queue-name"
DEFAULT_QUEUE = "default"
QUEUE_OPEN = "Open"
UNSCHEDULABLE_CONDITION = "Unschedulable"
SCHEDULED_CONDITION = "Scheduled"
NOT_ENOUGH_RESOURCES = "NotEnoughResources"
SCHEDULED_REASON = "tasks in gang are ready to be scheduled"
QUEUE_NOT_OPEN = "QueueNotOpen"
UNINQUEUEABLE_EVENT = "Uninqueueable"
# Volcano's overcommit plugin admits a group to Inqueue when its minResources fit into the idle
# resources times this factor (its default).
OVERCOMMIT_FACTOR = Fraction(12, 10)

Obj = Mapping[str, Any]
PodKey = tuple[str, str]  # (namespace, name)

_QUANTITY = re.compile(
    r"^([+-]?[0-9]*\.?[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_SUFFIX = {
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}


def parse_quantity(value: str | int | float) -> Fraction:
    """A Kubernetes resource quantity ("128", "512Gi", "250m", "1e3") as an exact number."""
    if isinstance(value, int | float):
        return Fraction(value)
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {value!r}")
    number, suffix = match.groups()
    amount = Fraction(number)
    if suffix is None:
        return amount
    if suffix[0] in "eE":
        return amount * Fraction(10) ** int(suffix[1:])
    return amount * _SUFFIX[suffix]


Resources = dict[str, Fraction]


def _add(total: Resources, extra: Mapping[str, Fraction]) -> None:
    for name, amount in extra.items():
        total[name] = total.get(name, Fraction(0)) + amount


def _container_requests(container: Obj) -> Resources:
    resources = container.get("resources") or {}
    # The API server defaults requests from limits; read limits too for objects not yet defaulted.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: parse_quantity(amount) for name, amount in merged.items()}


def pod_requests(pod: Obj) -> Resources:
    """What a pod needs from a node, as kube-scheduler computes it (sidecars add to containers)."""
    spec = pod.get("spec") or {}
    containers: Resources = {}
    for container in spec.get("containers") or []:
        _add(containers, _container_requests(container))
    sidecars: Resources = {}
    init_peaks: list[Resources] = []
    for init in spec.get("initContainers") or []:
        requests = _container_requests(init)
        if init.get("restartPolicy") == "Always":
            _add(sidecars, requests)
            continue
        # A regular init container runs alone, beside the sidecars started before it.
        peak = dict(sidecars)
        _add(peak, requests)
        init_peaks.append(peak)
    total = dict(containers)
    _add(total, sidecars)
    for peak in init_peaks:
        for name, amount in peak.items():
            total[name] = max(total.get(name, Fraction(0)), amount)
    _add(total, {name: parse_quantity(v) for name, v in (spec.get("overhead") or {}).items()})
    total["pods"] = Fraction(1)
    return total


def _name(obj: Obj) -> str:
    return str(obj["metadata"]["name"])


def _namespace(obj: Obj) -> str:
    return str(obj["metadata"].get("namespace") or "")


def pod_key(pod: Obj) -> PodKey:
    return (_namespace(pod), _name(pod))


def is_terminal(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def is_pending_unbound(pod: Obj) -> bool:
    """Waiting for a node: unbound, not being deleted, and not held back by scheduling gates."""
    spec = pod.get("spec") or {}
    return (
        not spec.get("nodeName")
        and not spec.get("schedulingGates")
        and not pod["metadata"].get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase", "Pending") == "Pending"
    )


def node_allocatable(node: Obj) -> Resources:
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {name: parse_quantity(amount) for name, amount in allocatable.items()}


def free_resources(nodes: Iterable[Obj], pods: Iterable[Obj]) -> dict[str, Resources]:
    """Allocatable minus what every bound, non-terminal pod (of any scheduler) requests."""
    free = {_name(node): node_allocatable(node) for node in nodes}
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name in free and not is_terminal(pod):
            for name, amount in pod_requests(pod).items():
                free[node_name][name] = free[node_name].get(name, Fraction(0)) - amount
    return free


def node_is_ready(node: Obj) -> bool:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return bool(condition.get("status") == "True")
    return False


def _matches_expression(labels: Mapping[str, str], expression: Obj) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator", "")
    values = [str(v) for v in expression.get("values") or []]
    present = key in labels
    if operator == "In":
        return present and labels[key] in values
    if operator == "NotIn":
        return not present or labels[key] not in values
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(values) == 1:
        try:
            actual, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def _matches_term(node: Obj, term: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    fields = {"metadata.name": _name(node)}
    expressions = term.get("matchExpressions") or []
    field_expressions = term.get("matchFields") or []
    if not expressions and not field_expressions:
        return False  # an empty term matches nothing, as in kube-scheduler
    return all(_matches_expression(labels, e) for e in expressions) and all(
        _matches_expression(fields, e) for e in field_expressions
    )


def matches_node_selection(pod: Obj, node: Obj) -> bool:
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    if terms is None:
        return True
    return any(_matches_term(node, term) for term in terms)


def _tolerates(toleration: Obj, taint: Obj) -> bool:
    effect = toleration.get("effect")
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key")
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return bool((toleration.get("value") or "") == (taint.get("value") or ""))


def untolerated_taint(pod: Obj, node: Obj) -> Obj | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(toleration, taint) for toleration in tolerations):
            return dict(taint)
    return None


def node_rejections(pod: Obj, node: Obj, free: Resources, requests: Resources) -> list[str]:
    """Why `pod` cannot go on `node` now, in kube-scheduler's words; empty when it fits."""
    if not node_is_ready(node):
        return ["node(s) were not ready"]
    if (node.get("spec") or {}).get("unschedulable"):
        return ["node(s) were unschedulable"]
    if not matches_node_selection(pod, node):
        return ["node(s) didn't match Pod's node affinity/selector"]
    taint = untolerated_taint(pod, node)
    if taint is not None:
        value = f": {taint['value']}" if taint.get("value") else ""
        return [f"node(s) had untolerated taint {{{taint.get('key')}{value}}}"]
    reasons = []
    for name, amount in sorted(requests.items()):
        if amount > 0 and free.get(name, Fraction(0)) < amount:
            reasons.append("Too many pods" if name == "pods" else f"Insufficient {name}")
    return reasons


def fit_error(node_count: int, reasons_by_node: Mapping[str, list[str]]) -> str:
    """kube-scheduler's words: "0/2 nodes are available: 2 Insufficient aws.amazon.com/neuron."."""
    counts = Counter(reason for reasons in reasons_by_node.values() for reason in reasons)
    if node_count == 0:
        return "0/0 nodes are available: no nodes available to schedule pods."
    detail = ", ".join(f"{count} {reason}" for reason, count in sorted(counts.items()))
    return f"0/{node_count} nodes are available: {detail}."


@dataclass
class Placement:
    bindings: dict[PodKey, str] = field(default_factory=dict)
    failures: dict[PodKey, str] = field(default_factory=dict)  # pod -> fit error


def place_pods(
    pods: Sequence[Obj], nodes: Sequence[Obj], free: dict[str, Resources]
) -> tuple[Placement, dict[str, Resources]]:
    """First-fit over nodes sorted by name; returns the placement and the free resources left."""
    remaining = {name: dict(resources) for name, resources in free.items()}
    ordered_nodes = sorted(nodes, key=_name)
    placement = Placement()
    for pod in pods:
        requests = pod_requests(pod)
        reasons_by_node: dict[str, list[str]] = {}
        for node in ordered_nodes:
            node_free = remaining.get(_name(node), {})
            reasons = node_rejections(pod, node, node_free, requests)
            if not reasons:
                placement.bindings[pod_key(pod)] = _name(node)
                for name, amount in requests.items():
                    node_free[name] = node_free.get(name, Fraction(0)) - amount
                break
            reasons_by_node[_name(node)] = reasons
        else:
            placement.failures[pod_key(pod)] = fit_error(len(ordered_nodes), reasons_by_node)
    return placement, remaining


@dataclass(frozen=True, slots=True)
class EventIntent:
    """An Event to post: on a Pod or a PodGroup, deduplicated by the runner."""

    kind: str
    namespace: str
    name: str
    type: str
    reason: str
    message: str


@dataclass
class SchedulingPlan:
    bindings: dict[PodKey, str] = field(default_factory=dict)
    unschedulable_pods: dict[PodKey, str] = field(default_factory=dict)  # pod -> message
    podgroup_status: dict[PodKey, dict[str, Any]] = field(default_factory=dict)
    queue_status: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[EventIntent] = field(default_factory=list)


def group_of(pod: Obj) -> str | None:
    annotations = pod["metadata"].get("annotations") or {}
    group = annotations.get(GROUP_NAME_ANNOTATION)
    return str(group) if group else None


def is_gang_pod(pod: Obj) -> bool:
    return (pod.get("spec") or {}).get("schedulerName") == SCHEDULER_NAME


def _queue_state(queue: Obj | None) -> str:
    if queue is None:
        return "NotFound"
    return str((queue.get("status") or {}).get("state") or QUEUE_OPEN)


def _unbound_claims(pod: Obj, bound_claims: set[PodKey]) -> list[str]:
    namespace = _namespace(pod)
    claims = []
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        claim = (volume.get("persistentVolumeClaim") or {}).get("claimName")
        if claim and (namespace, claim) not in bound_claims:
            claims.append(str(claim))
    return claims


def _fits_within(request: Resources, available: Resources, factor: Fraction) -> bool:
    return all(
        amount <= available.get(name, Fraction(0)) * factor
        for name, amount in request.items()
        if amount > 0
    )


def _condition(kind: str, status: str, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def _merge_conditions(
    existing: list[dict[str, Any]], updates: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Replaces conditions by type, keeping lastTransitionTime when nothing but the time changed."""
    merged = {c.get("type"): dict(c) for c in existing}
    for update in updates:
        old = merged.get(update["type"])
        if old is not None and all(
            old.get(k) == update[k] for k in ("status", "reason", "message")
        ):
            continue
        merged[update["type"]] = update
    return [merged[key] for key in sorted(merged, key=str)]


def gang_message(
    *, min_member: int, total: int, pending: int, ready: int, schedulable: int, origin: str
) -> str:
    """Volcano's gang-plugin wording for a group that cannot start."""
    unready = max(min_member - ready - schedulable, 0)
    unschedulable = pending - schedulable
    detail = f"Pending: {unschedulable} Unschedulable"
    if schedulable:
        detail += f", {schedulable} Schedulable"
    return (
        f"{unready}/{total} tasks in gang unschedulable: pod group is not ready, "
        f"{pending} Pending, {min_member} minAvailable; {detail}. Origin reason is {origin}"
    )


def plan_scheduling(
    *,
    nodes: Sequence[Obj],
    pods: Sequence[Obj],
    podgroups: Sequence[Obj],
    queues: Sequence[Obj],
    bound_claims: set[PodKey],
    now: str,
) -> SchedulingPlan:
    """One scheduling session: which pods to bind where, and each PodGroup's status after it."""
    plan = SchedulingPlan()
    free = free_resources(nodes, pods)
    queues_by_name = {_name(queue): queue for queue in queues}
    members: dict[PodKey, list[Obj]] = {}
    for pod in pods:
        group = group_of(pod)
        if is_gang_pod(pod) and group:
            members.setdefault((_namespace(pod), group), []).append(pod)

    def creation_order(podgroup: Obj) -> tuple[str, str, str]:
        meta = podgroup["metadata"]
        return (str(meta.get("creationTimestamp") or ""), _namespace(podgroup), _name(podgroup))

    phases: dict[PodKey, str] = {}
    for podgroup in sorted(podgroups, key=creation_order):
        key = (_namespace(podgroup), _name(podgroup))
        spec = podgroup.get("spec") or {}
        status = dict(podgroup.get("status") or {})
        min_member = max(int(spec.get("minMember") or 1), 1)
        group_pods = sorted(members.get(key, []), key=_name)
        pending = [p for p in group_pods if is_pending_unbound(p)]
        phase_of = [(p.get("status") or {}).get("phase", "Pending") for p in group_pods]
        bound_active = [
            p for p in group_pods if (p.get("spec") or {}).get("nodeName") and not is_terminal(p)
        ]
        succeeded = phase_of.count("Succeeded")
        conditions: list[dict[str, Any]] = []
        queue_name = str(spec.get("queue") or DEFAULT_QUEUE)
        queue_state = _queue_state(queues_by_name.get(queue_name))
        previous_phase = str(status.get("phase") or "Pending")
        phase = previous_phase
        newly_bound: dict[PodKey, str] = {}
        unschedulable = False

        if queue_state != QUEUE_OPEN:
            message = (
                f"queue {queue_name!r} is {'missing' if queue_state == 'NotFound' else queue_state}"
            )
            conditions.append(
                _condition(UNSCHEDULABLE_CONDITION, "True", QUEUE_NOT_OPEN, message, now)
            )
            unschedulable = True
            for pod in pending:
                plan.unschedulable_pods[pod_key(pod)] = message
        else:
            if previous_phase == "Pending":
                min_resources = {
                    name: parse_quantity(v) for name, v in (spec.get("minResources") or {}).items()
                }
                idle: Resources = {}
                for node in nodes:
                    if node_is_ready(node):
                        _add(idle, {n: max(a, Fraction(0)) for n, a in free[_name(node)].items()})
                if _fits_within(min_resources, idle, OVERCOMMIT_FACTOR):
                    phase = "Inqueue"
                else:
                    plan.events.append(
                        EventIntent(
                            "PodGroup",
                            key[0],
                            key[1],
                            "Warning",
                            UNINQUEUEABLE_EVENT,
                            "minResources exceed the idle resources of the cluster "
                            f"(overcommit factor {float(OVERCOMMIT_FACTOR)})",
                        )
                    )
            if phase != "Pending" and pending:
                placeable = []
                claim_failures: dict[PodKey, str] = {}
                for pod in pending:
                    claims = _unbound_claims(pod, bound_claims)
                    if claims:
                        claim_failures[pod_key(pod)] = (
                            "pod has unbound immediate PersistentVolumeClaims: " + ", ".join(claims)
                        )
                    else:
                        placeable.append(pod)
                trial, remaining = place_pods(placeable, nodes, free)
                failures = {**claim_failures, **trial.failures}
                ready = len(bound_active) + succeeded  # Volcano ReadyTaskNum: no Failed
                if ready + len(trial.bindings) >= min_member:
                    newly_bound = trial.bindings
                    free = remaining
                    for pod_id, error in failures.items():
                        plan.unschedulable_pods[pod_id] = error
                else:
                    first_failure = next(iter(failures.items()), None)
                    origin = (
                        f"{first_failure[0][1]}: {first_failure[1]}"
                        if first_failure
                        else f"{len(group_pods)} of minMember {min_member} pods exist"
                    )
                    message = gang_message(
                        min_member=min_member,
                        total=len(group_pods),
                        pending=len(pending),
                        ready=ready,
                        schedulable=len(trial.bindings),
                        origin=origin,
                    )
                    conditions.append(
                        _condition(
                            UNSCHEDULABLE_CONDITION, "True", NOT_ENOUGH_RESOURCES, message, now
                        )
                    )
                    unschedulable = True
                    for pod in pending:
                        plan.unschedulable_pods[pod_key(pod)] = message
                    plan.events.append(
                        EventIntent(
                            "PodGroup", key[0], key[1], "Warning", UNSCHEDULABLE_CONDITION, message
                        )
                    )
            plan.bindings.update(newly_bound)

        running = phase_of.count("Running")
        if running and unschedulable:
            phase = "Unknown"
        else:
            # Volcano's jobStatus: finished pods count as allocated; all finished is Completed.
            finished = succeeded + phase_of.count("Failed")
            allocated = len(bound_active) + len(newly_bound) + finished
            if allocated >= min_member:
                phase = "Completed" if finished == allocated else "Running"
                if not unschedulable:
                    conditions.append(
                        _condition(SCHEDULED_CONDITION, "True", SCHEDULED_REASON, "", now)
                    )
                    conditions.append(
                        _condition(UNSCHEDULABLE_CONDITION, "False", SCHEDULED_REASON, "", now)
                    )
            elif phase != "Inqueue":
                phase = "Pending"
        existing_conditions = list(status.get("conditions") or [])
        if not any(c.get("type") == UNSCHEDULABLE_CONDITION for c in existing_conditions):
            # Nothing to clear if the group was never unschedulable.
            conditions = [
                c
                for c in conditions
                if not (c["type"] == UNSCHEDULABLE_CONDITION and c["status"] == "False")
            ]
        desired = {
            **status,
            "phase": phase,
            "conditions": _merge_conditions(existing_conditions, conditions),
            "running": running,
            "succeeded": succeeded,
            "failed": phase_of.count("Failed"),
        }
        phases[key] = phase
        if desired != podgroup.get("status"):
            plan.podgroup_status[key] = desired

    for pod_id, message in plan.unschedulable_pods.items():
        plan.events.append(
            EventIntent("Pod", pod_id[0], pod_id[1], "Warning", "FailedScheduling", message)
        )
    plan.queue_status = _queue_statuses(queues, podgroups, phases, pods, plan.bindings)
    return plan


def _queue_statuses(
    queues: Sequence[Obj],
    podgroups: Sequence[Obj],
    phases: Mapping[PodKey, str],
    pods: Sequence[Obj],
    new_bindings: Mapping[PodKey, str],
) -> dict[str, dict[str, Any]]:
    """Open state and per-phase PodGroup counts, as Volcano's queue controller keeps them."""
    counts: dict[str, Counter[str]] = {}
    group_queue: dict[PodKey, str] = {}
    for podgroup in podgroups:
        key = (_namespace(podgroup), _name(podgroup))
        queue = str((podgroup.get("spec") or {}).get("queue") or DEFAULT_QUEUE)
        group_queue[key] = queue
        counts.setdefault(queue, Counter())[phases.get(key, "Pending")] += 1
    allocated: dict[str, Resources] = {}
    for pod in pods:
        group = group_of(pod)
        bound = (pod.get("spec") or {}).get("nodeName") or pod_key(pod) in new_bindings
        if group and bound and not is_terminal(pod):
            group_queue_name = group_queue.get((_namespace(pod), group))
            if group_queue_name:
                _add(allocated.setdefault(group_queue_name, {}), pod_requests(pod))
    statuses = {}
    for queue_obj in queues:
        name = _name(queue_obj)
        status = dict(queue_obj.get("status") or {})
        phase_counts = counts.get(name, Counter())
        desired = {
            **status,
            "state": status.get("state") or QUEUE_OPEN,
            "pending": phase_counts["Pending"],
            "inqueue": phase_counts["Inqueue"],
            "running": phase_counts["Running"],
            "completed": phase_counts["Completed"],
            "unknown": phase_counts["Unknown"],
            "allocated": {
                resource: format_quantity(amount)
                for resource, amount in sorted(allocated.get(name, {}).items())
            },
        }
        if desired != queue_obj.get("status"):
            statuses[name] = desired
    return statuses


def format_quantity(amount: Fraction) -> str:
    """Whole numbers as integers, fractions (cpu) in milli-units."""
    if amount.denominator == 1:
        return str(amount.numerator)
    return f"{round(amount * 1000)}m"


def implicit_podgroup(pod: Obj) -> dict[str, Any]:
    """The PodGroup Volcano's controller creates for a volcano pod that names none (minMember 1)."""
    meta = pod["metadata"]
    owners = [ref for ref in meta.get("ownerReferences") or [] if ref.get("controller")]
    if owners:
        owner = owners[0]
        owner_ref = {k: owner[k] for k in ("apiVersion", "kind", "name", "uid")}
    else:
        owner_ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    annotations = meta.get("annotations") or {}
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {
            "name": f"podgroup-{owner_ref['uid']}",
            "namespace": meta.get("namespace"),
            "ownerReferences": [{**owner_ref, "controller": True, "blockOwnerDeletion": True}],
        },
        "spec": {
            "minMember": 1,
            "queue": annotations.get(QUEUE_NAME_ANNOTATION) or DEFAULT_QUEUE,
            "priorityClassName": (pod.get("spec") or {}).get("priorityClassName") or "",
        },
    }

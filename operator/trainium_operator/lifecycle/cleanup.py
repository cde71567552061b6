"""Deleting a job's pods so that nothing hangs in Terminating: the deletion policy.

A pod is force-deleted (grace 0) only where its kubelet cannot confirm: its node is lost, or its
deletion is overdue (still there `bound` seconds after its grace period ended, a kubelet that
does not answer). Everything else gets a normal delete, so the script sees SIGTERM and its
grace period.
"""

from __future__ import annotations

from datetime import timedelta

from trainium_operator.api import kueue
from trainium_operator.api.spec import CleanPodPolicy
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.decision import Decision, PodDeletion
from trainium_operator.lifecycle.observed import Observed, PodView

MIN_STUCK_SECONDS = 10.0


def stuck_bound(job: JobRef) -> float:
    """How long past its grace period a pod may stay Terminating before it is force-deleted:
    spec.runPolicy.nodeLostGracePeriodSeconds (the same patience as for a lost node), at least
    10 s."""
    return max(float(job.spec.run_policy.node_lost_grace_period_seconds), MIN_STUCK_SECONDS)


def is_lost(pod: PodView, observed: Observed) -> bool:
    node = observed.nodes.get(pod.node) if pod.node else None
    if node is None:
        return bool(pod.node) and observed.nodes_known
    return not node.ready


def is_overdue(pod: PodView, observed: Observed, bound: float) -> bool:
    """Terminating `bound` seconds past the end of its grace period."""
    due = pod.deletion_due
    return (
        pod.deleting
        and not pod.terminal
        and due is not None
        and observed.now >= due + timedelta(seconds=bound)
    )


def deletion(pod: PodView, *, force: bool) -> PodDeletion:
    """A pod's deletion; a forced one also lifts Kueue's finalizer, which would otherwise keep
    the pod (and the next attempt waiting for it) until Kueue gives up on the node."""
    release = kueue.MANAGED_FINALIZER if force and pod.kueue_finalizer else None
    return PodDeletion(pod.name, force=force, release_finalizer=release)


def delete_gang(decision: Decision, pods: list[PodView], observed: Observed, bound: float) -> None:
    for pod in pods:
        force = is_lost(pod, observed) or is_overdue(pod, observed, bound)
        if force or not pod.deleting:
            decision.delete_pods.append(deletion(pod, force=force))


def release_podgroups(job: JobRef, decision: Decision, observed: Observed) -> None:
    """An ended job's PodGroups go once no live pod of their stage needs them: Volcano keeps
    reserving an admitted PodGroup's minResources (a job that failed before its pods existed
    would hold a node's worth of capacity until someone deleted the job)."""
    for stage in Stage:
        name = job.podgroup_name(stage)
        live = any(p.stage is stage and not p.terminal for p in observed.pods)
        if name in observed.podgroups and not live and name not in decision.delete_podgroups:
            decision.delete_podgroups.append(name)


def cleanup_on_finish(job: JobRef, decision: Decision, observed: Observed) -> None:
    """spec.runPolicy.cleanPodPolicy once the job has ended, and its PodGroups released."""
    release_podgroups(job, decision, observed)
    policy = job.spec.run_policy.clean_pod_policy
    if policy is CleanPodPolicy.NONE:
        return
    bound = stuck_bound(job)
    doomed = [
        p
        for p in observed.pods
        if (policy is CleanPodPolicy.ALL or not p.terminal)
        and (not p.deleting or is_lost(p, observed) or is_overdue(p, observed, bound))
    ]
    delete_gang(decision, doomed, observed, bound)


def while_deleting(observed: Observed, bound: float) -> list[PodDeletion]:
    """The job is being deleted (foreground deletion waits for its children): pods on a lost
    node, or whose deletion is overdue, would stay Terminating forever, so those are
    force-deleted."""
    return [
        deletion(p, force=True)
        for p in observed.pods
        if p.deleting
        and not p.terminal
        and (is_lost(p, observed) or is_overdue(p, observed, bound))
    ]

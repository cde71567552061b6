"""The gang preflight's verdict (spec.preflight; contract/preflight.py). Pure.

A preflighted gang's pods first check their node and the gang; an unfit gang's pods all end
with the preflight's exit codes, each with its own node's report as its termination message.
This policy runs before `failures` (which would charge those exits to backoffLimit, or end the
job in the compile stage):

- It waits for every pod of the gang to end (bounded: REPORT_WAIT_SECONDS after the first), so
  each node is judged against all the others.
- It reads each pod's report as that pod's node's (the node the pod ran on, never a name in the
  report: one node's pod cannot speak for another), judges them with the same rule the pods
  applied (`contract.preflight.judge`), and records status.preflight: the outcome, the unfit
  nodes with the operator's wording of their figures, and how long the check ran (goodput's
  preflightSeconds).
- Unfit nodes join status.preflight.excludedNodes, which the job's later pods avoid through a
  required node affinity (builders/pods.avoid_nodes). The verdict comes from the job's own
  pods, which its author controls, so by default it changes nothing beyond this job. With
  spec.preflight.onUnfit: Cordon (admitted only for authors the cluster admin allows to cordon,
  as onStraggler: Replace is) each newly unfit node is also cordoned, within the operator's
  cluster-wide cordon budget (shared with stragglers; the applier checks it again under its
  lock); past the budget it is only excluded, and status.preflight.held says why.
- Then the gang restarts (status.restarts.preflight, budget spec.preflight.maxRetries), or the
  job fails with PreflightFailed once the budget or MAX_EXCLUDED_NODES is spent.
- A gang that passed leaves its reports as its pods' messages too (the stage's command writes
  none, except the native compile stage's cache summary): once its first pod ends, the longest
  check it reports is recorded as status.preflight.passed, once per gang, for goodput.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from trainium_operator.api.spec import PreflightAction
from trainium_operator.api.status import (
    FailureClass,
    Phase,
    PreflightNode,
    PreflightOutcome,
    PreflightPassed,
    PreflightStatus,
)
from trainium_operator.contract import preflight as contract
from trainium_operator.lifecycle.cleanup import cleanup_on_finish
from trainium_operator.lifecycle.decision import EventRecord, NodePatch
from trainium_operator.lifecycle.failures import Failure
from trainium_operator.lifecycle.observed import (
    PodView,
)
from trainium_operator.lifecycle.policies.stragglers import (
    CORDON_BUDGET_SETTING,
    CORDONED_FOR_PREFLIGHT,
    CordonBudget,
    node_cordon,
)
from trainium_operator.lifecycle.restarts import restart_for
from trainium_operator.lifecycle.status_edit import timestamp

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

# How long after the first pod ended the others may take to end too (they judge the same
# reports at the same moment; a pod still running after this is read as having no report).
REPORT_WAIT_SECONDS = 30.0
MAX_EXCLUDED_NODES = 16  # the job's pods carry the list: a bound on their affinity
MAX_LISTED = 16  # unfit nodes listed in status.preflight.unfit
REASON_FAILED = "PreflightFailed"
REASON_EXCLUDED = "PreflightNodeExcluded"
_RESTART_REASONS = {
    PreflightOutcome.UNFIT: "PreflightNodeUnfit",
    PreflightOutcome.TIMED_OUT: "PreflightTimedOut",
    PreflightOutcome.FAILED: REASON_FAILED,
}


def _ended_by_preflight(pod: PodView) -> bool:
    return pod.phase == "Failed" and pod.exit_code in contract.EXIT_CODES


def preflight(p: Pass) -> None:
    job = p.job
    if not job.spec.preflight_on(p.snapshot.settings.preflight_multi_node):
        return
    stage, attempt = p.stage, p.attempt
    gang = p.observed.gang(stage, attempt)
    said = [pod for pod in gang.values() if _ended_by_preflight(pod)]
    if not said:
        _record_passed(p, gang.values())
        return
    still = [pod for pod in gang.values() if not pod.terminal and not pod.deleting]
    if still:
        first_end = min((pod.finished_at or p.now for pod in said), default=p.now)
        remaining = REPORT_WAIT_SECONDS - (p.now - first_end).total_seconds()
        if remaining > 0:
            p.plan.requeue(remaining)
            p.settle()  # nothing else acts on this gang until its reports are in
            return
    reports = _node_reports(gang.values())
    threshold = job.spec.preflight.threshold
    verdicts = contract.judge(reports, threshold) if reports else []
    if verdicts:
        outcome = PreflightOutcome.UNFIT
    elif any(pod.exit_code == contract.EXIT_TIMEOUT for pod in said) or any(
        r.outcome == contract.TIMEOUT for r in reports.values()
    ):
        outcome = PreflightOutcome.TIMED_OUT
    else:
        outcome = PreflightOutcome.FAILED
    previous = p.status.preflight
    excluded = list(previous.excluded_nodes) if previous is not None else []
    added = [v.node for v in verdicts if v.node not in excluded]
    seconds = max((r.seconds for r in reports.values()), default=0.0)
    cordoned, held = list(previous.cordoned) if previous is not None else [], None
    if job.spec.preflight.on_unfit is PreflightAction.CORDON and added:
        patches, held = _cordons(p, [v for v in verdicts if v.node in added], attempt)
        p.plan.patch_nodes += patches
        cordoned += [patch.name for patch in patches]
    p.status.preflight = PreflightStatus(
        attempt=attempt,
        stage=stage.value,
        outcome=outcome,
        seconds=round(seconds, 1),
        reports=len(reports),
        unfit=[
            PreflightNode(node=v.node, reason=v.reason, detail=v.detail, ratio=v.ratio)
            for v in verdicts[:MAX_LISTED]
        ],
        excluded_nodes=excluded + added,
        cordoned=cordoned,
        time=timestamp(p.now),
        **({"held": held} if held is not None else {}),
        **({"passed": previous.passed} if previous is not None and previous.passed else {}),
    )
    if held is not None:
        p.plan.events.append(EventRecord("Warning", "PreflightNodeNotCordoned", held))
    head = (
        f"the preflight of {stage.value} attempt {attempt} ({len(reports)} of {len(gang)} node "
        "reports)"
    )
    message = _summary(head, outcome, verdicts)
    first_unfit = verdicts[0].node if verdicts else None
    failure = Failure(
        FailureClass.PREFLIGHT, stage, _RESTART_REASONS[outcome], message, node=first_unfit
    )
    used, limit = p.status.restarts.preflight, job.spec.preflight.max_retries
    for verdict in verdicts:
        if verdict.node in added:
            p.plan.events.append(
                EventRecord(
                    "Warning",
                    REASON_EXCLUDED,
                    f"node {verdict.node} failed the preflight of {stage.value} attempt "
                    f"{attempt}: {verdict.detail}; this job's later pods avoid it",
                )
            )
    if len(excluded) + len(added) > MAX_EXCLUDED_NODES or used >= limit:
        spent = (
            f"spec.preflight.maxRetries ({limit}) exhausted"
            if used >= limit
            else f"more than {MAX_EXCLUDED_NODES} nodes would be excluded"
        )
        p.status.record_failure(failure)
        p.status.finish(Phase.FAILED, REASON_FAILED, f"{message}; {spent}")
        cleanup_on_finish(job, p.plan, p.observed)
    else:
        restart_for(p, failure, "preflight", attempt=attempt)
    p.settle()


def _summary(head: str, outcome: PreflightOutcome, verdicts: list[contract.NodeVerdict]) -> str:
    """The verdict in the operator's words: node names and parsed numbers only."""
    if outcome is PreflightOutcome.UNFIT:
        named = "; ".join(f"{v.node}: {v.detail}" for v in verdicts[:3])
        more = f" and {len(verdicts) - 3} more" if len(verdicts) > 3 else ""
        return f"{head} found {len(verdicts)} unfit node(s): {named}{more}"
    if outcome is PreflightOutcome.TIMED_OUT:
        return (
            f"{head} did not finish within spec.preflight.timeoutSeconds; no node is below "
            "the bound by the reports read"
        )
    return f"{head} failed, but no node is below the bound by the reports read"


def _cordons(
    p: Pass, unfit: list[contract.NodeVerdict], attempt: int
) -> tuple[list[NodePatch], str | None]:
    """The cordons of newly unfit nodes the budget has room for, and why the others (if any)
    are only excluded."""
    budget, patches, held = p.snapshot.cordon_budget, [], None
    for verdict in unfit:
        refused = (
            budget.refusal(verdict.node)
            if budget.limit > 0
            else f"this operator cordons no nodes ({CORDON_BUDGET_SETTING})"
        )
        if refused is not None:
            held = f"node {verdict.node} is excluded, not cordoned: {refused}"
            continue
        budget = CordonBudget(budget.limit, budget.cordoned | {verdict.node})
        reason = (
            f"preflight: TrainingJob {p.job.namespace}/{p.job.name} (attempt {attempt}) found "
            f"this node unfit: {verdict.detail} (spec.preflight.onUnfit: Cordon). "
            "`kubectl uncordon` returns it"
        )
        patches.append(
            node_cordon(p.job, verdict.node, CORDONED_FOR_PREFLIGHT, reason, timestamp(p.now))
        )
    return patches, held


def _record_passed(p: Pass, gang: Iterable[PodView]) -> None:
    """status.preflight.passed for the current gang, once its first pod ended, from the
    reports its ended pods left (each pod's own)."""
    stage, attempt = p.stage, p.attempt
    record = p.status.preflight or PreflightStatus()
    if record.passed is not None and (record.passed.attempt, record.passed.stage) == (
        attempt,
        stage.value,
    ):
        return
    seconds = [r.seconds for r in _node_reports(gang).values() if r.outcome == contract.PASSED]
    if seconds:
        passed = PreflightPassed(attempt=attempt, stage=stage.value, seconds=round(max(seconds), 1))
        p.status.preflight = record.model_copy(update={"passed": passed})


def _node_reports(pods: Iterable[PodView]) -> dict[str, contract.NodeReport]:
    """Each ended pod's report, as the report of the node the pod ran on (never a name in
    it); a pod without one (still running, or its message is no report) is left out."""
    reports: dict[str, contract.NodeReport] = {}
    for pod in pods:
        if pod.node is None:
            continue
        try:
            reports[pod.node] = contract.parse_report(pod.termination_message)
        except ValueError:
            continue  # no report, or not one: this node is judged on nothing
    return reports

"""Stragglers: ranks persistently slower than the rest of their gang. One pure policy, fed the
ranks' newest health-channel messages by the job's reconcile pass (as `stalls` is).

- Each rank's step time is the median of its latest 16 (RECENT_STEPS) step times, and only once
  it has at least MIN_STEP_TIMES of them: "persistently" means most of a 16-step window, not one
  slow step (a checkpoint, a data-loader hiccup). Only ranks of the spec's world (0 <= rank <
  nodes x processesPerNode) count: a rank's message may claim any number.
- A rank is a straggler when that exceeds the median of the *other* ranks' step times by more
  than spec.health.stragglerThreshold (0.2: 20 %). Leaving the rank out keeps a two-rank gang's
  reference from being half the straggler itself. The gang's times are sorted once and each
  rank's reference read from that order (O(ranks log ranks): ~10 ms at 4096 ranks).
- Written to status.stragglers only when the set of stragglers changes (a bounded number of
  writes), with a Warning event `Straggler` naming each new one, its node and how much slower
  it is, and a Normal `StragglersRecovered` once none is left.

- spec.health.onStraggler: Replace. A straggler that stayed one without a break for
  stragglerPersistenceSeconds *and* RECENT_STEPS more steps (a whole window of step times that
  did not name it first) is replaced: the slowest such rank only (one node per replacement),
  within maxStragglerReplacements, and only when at least spec.nodes other schedulable Ready
  nodes of the instance type exist (else the gang would wait for a node that is not there; it
  keeps training and status.stragglers.held says why). The replacement is recorded in the
  status (status.stragglers.replacements, status.restarts.straggler, the restart itself) before
  anything happens; then the node is cordoned (spec.unschedulable, with annotations naming the
  job and the reason) and the gang restarts, for the scheduler to place it elsewhere. Until
  the node shows that cordon (or the new gang's pods exist), each pass re-asserts it (a failed
  or lost patch); once it was seen, the replacement records `cordonSeen` and no later pass
  cordons the node again: an admin's `kubectl uncordon` stands.
- Who may take nodes out of the cluster is the operator admin's choice, never the job
  author's: the author controls what the ranks report, so a job could name any node it ran
  on. Replace acts only within the operator's cluster-wide CordonBudget (its
  --straggler-cordon-budget, the chart's health.stragglerReplacement; 0, the default, turns it
  off): past it, or with it off, a straggler is only reported and status.stragglers.held says
  why. The policy judges the budget as the pass's snapshot shows it and only proposes the
  cordon; the reconciler checks and reserves it under its lock before the status is written
  (two jobs reconciled at once never both take the last node).

Limit (documented): in a gang that synchronises every step (data-parallel all-reduce), every
rank's step *wall* time is the slowest rank's, so step markers alone cannot single it out; this
rule sees ranks that step independently, or a slowness that shows between collectives.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import StragglerAction
from trainium_operator.api.status import (
    FailureClass,
    Phase,
    StragglerRank,
    StragglerReplacement,
    StragglersStatus,
)
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.lifecycle.decision import EventRecord, NodePatch
from trainium_operator.lifecycle.failures import Failure
from trainium_operator.lifecycle.observed import (
    CORDON_REASON_ANNOTATION,
    CORDON_TIME_ANNOTATION,
    CORDONED_BY_ANNOTATION,
    CORDONED_LABEL,
    NodeView,
    Observed,
    parse_time,
)
from trainium_operator.lifecycle.policies.progress import RECENT_STEPS, duration_text
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.restarts import restart_for
from trainium_operator.lifecycle.status_edit import timestamp

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

MIN_STEP_TIMES = 8
LISTED = 16
CORDONED_FOR_STRAGGLER = "straggler"
CORDONED_FOR_PREFLIGHT = "preflight"  # spec.preflight.onUnfit: Cordon (policies/preflight.py)
# Where the operator admin turns replacement on: named in every refusal, so the job author
# knows whom to ask.
CORDON_BUDGET_SETTING = (
    "Helm value health.stragglerReplacement (operator flag --straggler-cordon-budget)"
)


@dataclass(frozen=True)
class CordonBudget:
    """How many nodes this operator may keep cordoned for stragglers at once, cluster-wide, and
    which are cordoned now (by any job). A limit of 0: onStraggler: Replace only reports."""

    limit: int
    cordoned: frozenset[str] = frozenset()

    def refusal(self, node: str) -> str | None:
        """Why cordoning `node` is not allowed now; None when it is (a node already cordoned
        for a straggler costs nothing more)."""
        if self.limit <= 0:
            return (
                "this operator cordons no nodes for stragglers: spec.health.onStraggler: "
                f"Replace is off in this cluster ({CORDON_BUDGET_SETTING}); set onStraggler: "
                "Report, or ask the cluster admin to turn it on"
            )
        if node in self.cordoned or len(self.cordoned) < self.limit:
            return None
        named = ", ".join(sorted(self.cordoned)[:5]) + (", ..." if len(self.cordoned) > 5 else "")
        return (
            f"the operator's cluster-wide cordon budget is spent: {len(self.cordoned)} of "
            f"{self.limit} node(s) cordoned for stragglers ({named}); `kubectl uncordon` one "
            f"(kubectl get nodes -l {CORDONED_LABEL}) or raise the {CORDON_BUDGET_SETTING}"
        )


def cordoned_for_stragglers(nodes: Iterable[Obj]) -> frozenset[str]:
    """Nodes cordoned for a straggler or a failed preflight and still unschedulable: what the
    budget counts. An uncordoned node keeps its label (its history) but no longer counts."""
    return frozenset(
        str(n["metadata"]["name"])
        for n in nodes
        if (n["metadata"].get("labels") or {}).get(CORDONED_LABEL)
        in (CORDONED_FOR_STRAGGLER, CORDONED_FOR_PREFLIGHT)
        and bool((n.get("spec") or {}).get("unschedulable"))
    )


def _median(ordered: list[float]) -> float:
    """The median of a sorted list, as statistics.median computes it (same arithmetic)."""
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _median_without(ordered: list[float], index: int) -> float:
    """The median of sorted `ordered` less its element at `index`, in O(1). Of equal values,
    which one is left out does not change the rest."""
    size = len(ordered) - 1

    def at(position: int) -> float:
        return ordered[position] if position < index else ordered[position + 1]

    middle = size // 2
    if size % 2:
        return at(middle)
    return (at(middle - 1) + at(middle)) / 2


def rank_step_time_ms(rank: RankSample) -> float | None:
    recent = rank.step_times_ms[-RECENT_STEPS:]
    return _median(sorted(recent)) if len(recent) >= MIN_STEP_TIMES else None


def slow_ranks(
    ranks: list[RankSample], threshold: float
) -> tuple[list[StragglerRank], float | None]:
    """The stragglers (slowest first) and the gang's median step time: each rank's time against
    the median of the others', read from one sorted copy of the gang's times."""
    times = {r.rank: t for r in ranks if (t := rank_step_time_ms(r)) is not None}
    if len(times) < 2:
        return [], None
    nodes = {r.rank: r.node for r in ranks}
    ordered = sorted(times.values())
    position = {t: i for i, t in enumerate(ordered)}  # any index of an equal value will do
    slow: list[tuple[float, int, float]] = []  # (ratio, rank, step time)
    for number, own in times.items():
        others = _median_without(ordered, position[own])
        if others > 0 and own > (1 + threshold) * others:
            slow.append((round(own / others, 3), number, own))
    slow.sort(key=lambda s: (-s[0], s[1]))
    named = [
        _straggler(number, nodes.get(number), step_time_ms=round(own, 3), ratio=ratio)
        for ratio, number, own in slow[:LISTED]
    ]
    return named, _median(ordered)


def _straggler(
    number: int, node: str | None, *, step_time_ms: float, ratio: float
) -> StragglerRank:
    """A straggler's entry, its node named only when it is known."""
    entry = StragglerRank(rank=number, step_time_ms=step_time_ms, ratio=ratio)
    return entry.model_copy(update={"node": node}) if node else entry


def stragglers(p: Pass) -> None:
    """Names the stragglers of the training gang (from the ranks' reports) and, for
    onStraggler: Replace, proposes the cordon of a persistent one's node."""
    if p.snapshot.ranks is None:
        return
    job, edit = p.job, p.status
    threshold = job.spec.health.straggler_threshold
    if threshold is None:
        return
    if _keep_cordoned(p):
        return  # the new gang has no pods: not training, no straggler to judge
    if edit.phase is not Phase.TRAINING:
        return
    attempt = edit.attempt
    world = job.spec.nodes * job.spec.effective_processes_per_node
    current = [
        r for r in p.snapshot.ranks if r.attempt == attempt and not r.final and 0 <= r.rank < world
    ]
    found, gang = slow_ranks(current, threshold)
    previous = edit.stragglers
    before: dict[int, StragglerRank] = (
        {s.rank: s for s in previous.ranks}
        if previous is not None and previous.attempt == attempt
        else {}
    )
    if gang is None:
        return
    steps = {r.rank: r.step for r in current}
    slow = [_dated(entry, before.get(entry.rank), steps[entry.rank], p.now) for entry in found]
    now_slow = {s.rank for s in slow}
    dated = all(before[r].since for r in now_slow if r in before)
    if now_slow != set(before) or not dated:
        _record(p, previous, slow, bool(before), attempt=attempt, gang=gang)
        for entry in slow:
            if entry.rank not in before:
                p.plan.events.append(
                    EventRecord(
                        "Warning",
                        "Straggler",
                        f"{_slowness(entry)} (spec.health.stragglerThreshold {threshold:g})",
                    )
                )
    if job.spec.health.on_straggler is StragglerAction.REPLACE and slow:
        _consider_replacing(p, slow, steps, attempt=attempt, gang=gang)


def _dated(
    entry: StragglerRank, kept: StragglerRank | None, step: int, now: datetime
) -> StragglerRank:
    """`entry` with when (and at which step) it became a straggler: kept from the previous
    pass while it stayed one, else now."""
    since = kept.since if kept is not None and kept.since else timestamp(now)
    since_step = kept.since_step if kept is not None and kept.since_step is not None else step
    return entry.model_copy(update={"since": since, "since_step": since_step})


def _record(
    p: Pass,
    previous: StragglersStatus | None,
    slow: list[StragglerRank],
    had_stragglers: bool,
    *,
    attempt: int,
    gang: float,
) -> None:
    record = StragglersStatus(
        attempt=attempt,
        gang_step_time_ms=round(gang, 3),
        ranks=slow,
        update_time=timestamp(p.now),
    )
    # Replacements are the job's history (across attempts); `held` names a current straggler.
    if previous is not None and previous.replacements:
        record = record.model_copy(update={"replacements": previous.replacements})
    if previous is not None and previous.held and slow:
        record = record.model_copy(update={"held": previous.held})
    p.status.stragglers = record
    if had_stragglers and not slow:
        p.plan.events.append(
            EventRecord("Normal", "StragglersRecovered", "no rank is slower than the threshold")
        )


def persistent(entry: StragglerRank, step: int, persistence: float, now: datetime) -> float:
    """Seconds until `entry` (a straggler since entry.since, at entry.sinceStep) may be
    replaced: 0 when it may now; inf while its window of newer steps is not full yet."""
    since = parse_time(entry.since) or now
    since_step = entry.since_step if entry.since_step is not None else step
    if step - since_step < RECENT_STEPS:
        return float("inf")
    return max(persistence - (now - since).total_seconds(), 0.0)


def spare_nodes(job: JobRef, observed: Observed, node: str) -> list[str]:
    """Nodes the restarted gang could use: of its instance type, Ready, not cordoned, not the
    straggler's (busy or not: only the scheduler knows that)."""
    kind = job.spec.instance_type.value
    return sorted(
        n.name
        for n in observed.nodes.values()
        if n.name != node and n.ready and not n.unschedulable and n.instance_type == kind
    )


def _slowness(entry: StragglerRank) -> str:
    return (
        f"rank {entry.rank} on {entry.node or 'an unknown node'} steps in "
        f"{entry.step_time_ms or 0.0:.0f} ms, {100 * ((entry.ratio or 0.0) - 1):.0f} % slower "
        "than the other ranks' median"
    )


def _consider_replacing(
    p: Pass,
    slow: list[StragglerRank],
    steps: dict[int, int],
    *,
    attempt: int,
    gang: float,
) -> None:
    """onStraggler: Replace, for the slowest persistent straggler (one node per replacement),
    within the cluster-wide cordon budget as the snapshot shows it."""
    job, edit, decision, observed = p.job, p.status, p.plan, p.observed
    health, now, budget = job.spec.health, p.now, p.snapshot.cordon_budget
    waits = [persistent(e, steps[e.rank], health.straggler_persistence_seconds, now) for e in slow]
    due = [e for e, wait in zip(slow, waits, strict=True) if wait == 0]
    if not due:
        timed = [w for w in waits if w != float("inf")]
        if timed:
            decision.requeue(min(timed))
        return
    if not observed.nodes_known:
        return  # right after a start: every node would look gone
    target = due[0]
    node = target.node or ""
    used = edit.restarts.straggler
    limit = health.max_straggler_replacements
    held = None
    if not node:
        held = f"{_slowness(target)}, but its node is unknown: nothing to cordon"
    elif budget.limit <= 0 and (refused := budget.refusal(node)) is not None:
        held = f"{_slowness(target)}; only reported: {refused}"  # replacement is off
    elif used >= limit:
        held = (
            f"{_slowness(target)}; spec.health.maxStragglerReplacements ({limit}) is spent: "
            "only reported"
        )
    else:
        spare = spare_nodes(job, observed, node)
        if len(spare) < job.spec.nodes:
            held = (
                f"{_slowness(target)}; {node} is not replaced: only {len(spare)} other "
                f"schedulable Ready {job.spec.instance_type.value} node(s), the gang needs "
                f"{job.spec.nodes}"
            )
        elif (spent := budget.refusal(node)) is not None:
            held = f"{_slowness(target)}; only reported: {spent}"
    if held is not None:
        _hold(p, held)
        return
    _replace(p, target, node, attempt=attempt, gang=gang)


def _stored_record(p: Pass) -> StragglersStatus:
    """status.stragglers, which a pass that names a straggler has written or kept."""
    return p.status.stragglers or StragglersStatus()


def _hold(p: Pass, held: str) -> None:
    """status.stragglers.held and one Warning, once per reason."""
    record = _stored_record(p)
    if record.held != held:
        p.status.stragglers = record.model_copy(update={"held": held})
        p.plan.events.append(EventRecord("Warning", "StragglerNotReplaced", held))


def _without_held(record: StragglersStatus) -> StragglersStatus:
    """`record` as if `held` had never been set (model_copy can only add fields)."""
    kept = {name: getattr(record, name) for name in record.model_fields_set - {"held"}}
    return StragglersStatus.model_construct(set(kept), **kept)


def _replace(
    p: Pass,
    target: StragglerRank,
    node: str,
    *,
    attempt: int,
    gang: float,
) -> None:
    job, status, decision, now = p.job, p.status, p.plan, p.now
    since = parse_time(target.since) or now
    persistence = job.spec.health.straggler_persistence_seconds
    message = (
        f"{_slowness(target)} ({gang:.0f} ms) for {duration_text((now - since).total_seconds())}"
        f" (spec.health.stragglerPersistenceSeconds {persistence:g}); cordoning {node} and "
        "restarting the gang without it"
    )
    replacement = StragglerReplacement(
        attempt=attempt,
        rank=target.rank,
        node=node,
        step_time_ms=target.step_time_ms,
        ratio=target.ratio,
        time=timestamp(now),
    )
    record = _without_held(_stored_record(p))
    status.stragglers = record.model_copy(
        update={"replacements": [*record.replacements, replacement]}
    )
    failure = Failure(
        FailureClass.STRAGGLER, Stage.TRAIN, "Straggler", message, node=node, rank=target.rank
    )
    restart_for(p, failure, "straggler", attempt=attempt, reason="StragglerReplaced")
    decision.events.append(EventRecord("Warning", "StragglerReplaced", message))
    decision.patch_nodes.append(cordon_patch(job, replacement))


def cordon_patch(job: JobRef, replacement: StragglerReplacement) -> NodePatch:
    """The cordon of a replaced straggler's node: a JSON merge patch, the same on every pass
    (re-asserting it changes nothing)."""
    reason = (
        f"straggler: rank {replacement.rank} of TrainingJob {job.namespace}/{job.name} "
        f"(attempt {replacement.attempt}) stepped in {replacement.step_time_ms or 0.0:.0f} "
        f"ms, {replacement.ratio or 0.0:.2f}x the other ranks' median; the gang restarted "
        "without this node (spec.health.onStraggler: Replace). `kubectl uncordon` returns it"
    )
    return node_cordon(
        job, replacement.node, CORDONED_FOR_STRAGGLER, reason, replacement.time or ""
    )


def node_cordon(job: JobRef, node: str, cause: str, reason: str, time: str) -> NodePatch:
    """A JSON merge patch cordoning `node` for `job`: spec.unschedulable, the label the cordon
    budget counts (`cause`: CORDONED_FOR_STRAGGLER or CORDONED_FOR_PREFLIGHT), and annotations
    naming the job, why, and when."""
    return NodePatch(
        name=node,
        body={
            "metadata": {
                "labels": {CORDONED_LABEL: cause},
                "annotations": {
                    CORDONED_BY_ANNOTATION: f"{job.namespace}/{job.name}",
                    CORDON_REASON_ANNOTATION: reason,
                    CORDON_TIME_ANNOTATION: time,
                },
            },
            "spec": {"unschedulable": True},
        },
    )


def _keep_cordoned(p: Pass) -> bool:
    """Until the node of the last replacement shows its cordon, each pass re-asserts it (the
    pass that decided it may have failed or crashed between the status and the patch), within
    the cordon budget as it is then (an operator restarted with it off cordons nothing). Once
    the node showed it, the replacement records `cordonSeen` and the node is left alone: an
    admin's `kubectl uncordon` stands. Nothing either once the new gang has pods. True: the
    gang is between a replacement and its new pods (nothing else to judge)."""
    job, edit, observed, budget = p.job, p.status, p.observed, p.snapshot.cordon_budget
    record = edit.stragglers
    attempt = edit.attempt
    if record is None or not record.replacements:
        return False
    last = record.replacements[-1]
    if last.attempt != attempt - 1:
        return False
    if last.cordon_seen or observed.gang(Stage.TRAIN, attempt):
        return False
    node = observed.nodes.get(last.node)
    if node is None:
        return False
    if node.unschedulable or _carries_cordon(job, node, last):
        seen = last.model_copy(update={"cordon_seen": timestamp(observed.now)})
        edit.stragglers = record.model_copy(
            update={"replacements": [*record.replacements[:-1], seen]}
        )
        return False
    if budget.limit <= 0:
        return False
    if budget.refusal(node.name) is None:
        p.plan.patch_nodes.append(cordon_patch(job, last))
    return True


def _carries_cordon(job: JobRef, node: NodeView, replacement: StragglerReplacement) -> bool:
    """The node's annotations name this replacement: its cordon landed, even if the node was
    uncordoned before any pass saw it cordoned."""
    return node.cordoned_by == f"{job.namespace}/{job.name}" and node.cordoned_at == (
        replacement.time or ""
    )

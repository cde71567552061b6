"""Hang detection: a training gang none of whose ranks advances is Stalled. One pure policy,
fed the ranks' newest health-channel messages by the job's reconcile pass (as `progress` is),
writing through `status_edit`'s one condition setter.

What is decided here:
- **Watched**: a job in phase Training with the channel on. Of its current attempt, the ranks
  that have entered a step (step >= 0) and have not ended (their last message, `final`). Until
  one of them has finished a step there is no step time, and nothing is watched: the first step
  of an attempt compiles or loads its graphs and may take many minutes. A compile stage never
  reports, so it is never Stalled by this rule (its own bound is runPolicy.activeDeadline).
- **When a rank advanced** comes from its messages: each says how long the rank has been in its
  step (by the rank's monotonic clock), so the operator dates the step on its own clock
  (`RankSample.started`). An operator restarted mid-run (its store empty) therefore knows at
  the first message how long a rank has been stuck, and a healthy rank's first message shows a
  young step: no false stall. A rank whose profiler sends no age is dated by the operator's
  first sight of its step (after a restart, the bound starts then).
- **The bound**: spec.health.stallTimeoutSeconds, else max(3 x the gang's recent p50 step time,
  60 s); never below 3 report intervals (the operator hears of a step only that often). The
  gang is Stalled when its newest step start is older than the bound, decided `lead` (1 s, at
  most 10 % of the bound) before it so that the condition is written within the bound.
- **Stopped first**: the ranks at the lowest step, the oldest start of it first (the one that
  froze while the others wait for it in a collective).
- **Not before every rank was heard**: an operator that has just begun keeping messages (a
  start, a failover to this replica) decides nothing here until each rank of the gang reported
  since, or `progress.warm_up_left` ran out: a gang it knows only part of is never Stalled, or
  resumed, for the ranks it has not heard from yet.
- **Then**: the Stalled condition and one Warning event naming those ranks and their nodes; the
  operator's replies ask every rank of the attempt for its Python stacks (`stack_request`);
  it waits until every rank of the gang answered or `stack_wait_seconds` passed, records what
  came (status.stall.stacks and an event), and only then takes spec.health.onStall once:
  Report (nothing more; the condition clears when a rank advances past the stall), Restart
  (the gang, counted in status.restarts.stall, within spec.health.maxStallRestarts) or Fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import HealthSpec, StallAction
from trainium_operator.api.status import (
    ConditionType,
    FailureClass,
    Phase,
    StallStacks,
    StallStatus,
    StoppedRank,
)
from trainium_operator.builders.job import Stage
from trainium_operator.contract import channel as contract
from trainium_operator.lifecycle.cleanup import cleanup_on_finish
from trainium_operator.lifecycle.decision import EventRecord
from trainium_operator.lifecycle.failures import Failure
from trainium_operator.lifecycle.observed import parse_time
from trainium_operator.lifecycle.policies.progress import recent_p50_ms, warm_up_left
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.restarts import restart_for
from trainium_operator.lifecycle.status_edit import readable_section, timestamp

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

FLOOR_SECONDS = 60.0
P50_FACTOR = 3.0
MIN_REPORT_INTERVALS = 3.0
LEAD_SECONDS = 1.0
LEAD_FRACTION = 0.1
# The ranks answer a stack request in their next message (one interval) and say so at once;
# two intervals plus a margin for the write and the pass that reads the answers.
STACK_WAIT_INTERVALS = 2.0
STACK_WAIT_MARGIN_SECONDS = 3.0
NAMED_RANKS = 8
REQUEUE_MINIMUM_SECONDS = 0.1
LISTED_MISSING = 16


def stall_bound(health: HealthSpec, p50_ms: float) -> float:
    """Seconds without a new step after which the gang is Stalled."""
    if health.stall_timeout_seconds is not None:
        bound = float(health.stall_timeout_seconds)
    else:
        bound = max(P50_FACTOR * p50_ms / 1000.0, FLOOR_SECONDS)
    return max(bound, MIN_REPORT_INTERVALS * health.report_interval_seconds)


def decision_lead(bound: float) -> float:
    """How long before the bound the stall is decided, so its condition lands within it."""
    return min(LEAD_SECONDS, LEAD_FRACTION * bound)


def stack_wait_seconds(health: HealthSpec) -> float:
    return STACK_WAIT_INTERVALS * health.report_interval_seconds + STACK_WAIT_MARGIN_SECONDS


@dataclass(frozen=True, slots=True)
class Watch:
    """The current attempt's gang as the stall rule sees it."""

    ranks: list[RankSample]  # entered a step, not ended
    world: set[int]  # every rank of the gang that has not ended (asked for stacks)
    p50_ms: float
    bound: float
    last_progress: datetime  # the newest step start of any watched rank

    @property
    def step(self) -> int:
        return min(r.step for r in self.ranks)

    @property
    def max_step(self) -> int:
        return max(r.step for r in self.ranks)


def watch(
    health: HealthSpec, ranks: list[RankSample], attempt: int, world_size: int
) -> Watch | None:
    """None while nothing is watched (no rank has finished a step, or all ended).
    `world_size`: the job's spec's (nodes x processes per node), never a rank's number."""
    current = [r for r in ranks if r.attempt == attempt and r.rank < world_size]
    live = [r for r in current if r.step >= 0 and not r.final]
    p50 = recent_p50_ms(live)
    if not live or p50 is None:
        return None
    ended = {r.rank for r in current if r.final}
    return Watch(
        ranks=live,
        world=set(range(world_size)) - ended,
        p50_ms=p50,
        bound=stall_bound(health, p50),
        last_progress=max(r.started for r in live),
    )


def stopped_first(ranks: list[RankSample]) -> tuple[list[RankSample], int]:
    """The ranks at the lowest step, oldest start first (the first NAMED_RANKS), and how many
    more are there."""
    lowest = min(r.step for r in ranks)
    behind = sorted((r for r in ranks if r.step == lowest), key=lambda r: (r.started, r.rank))
    return behind[:NAMED_RANKS], max(len(behind) - NAMED_RANKS, 0)


def stack_request_id(attempt: int, now: datetime) -> str:
    return f"a{attempt}-{now:%Y%m%dT%H%M%SZ}"


def stack_request(status: Obj, attempt: int) -> str | None:
    """The stack request the operator's replies carry to this attempt's ranks, if any: the
    health channel's endpoint reads it from the job's status (its one source of truth)."""
    record = readable_section(status, "stall", StallStatus)
    stacks = record.stacks if record is not None else None
    if record is None or stacks is None or record.attempt != attempt:
        return None
    if stacks.state == "Requested" and contract.valid_request_id(stacks.request_id):
        return stacks.request_id
    return None


def requests_for(job: Obj | None, attempt: int, answered: str) -> dict[str, str]:
    """What the reply to a rank of `attempt` asks of it (`answered`: its last stack answer)."""
    request_id = stack_request((job or {}).get("status") or {}, attempt)
    if request_id is None or request_id == answered:
        return {}
    return {contract.REQUEST_DUMP_STACKS: request_id}


def stall(p: Pass) -> None:
    """The stall rule over the training gang's reports: detect, capture stacks, act."""
    if p.snapshot.ranks is None or p.status.phase is not Phase.TRAINING:
        return
    edit, attempt, now = p.status, p.status.attempt, p.now
    record = edit.stall
    if record is not None and record.attempt != attempt:
        # An earlier attempt's stall (the gang restarted for it or for another reason).
        stalled = edit.condition_of(ConditionType.STALLED)
        if stalled is not None and stalled.status == "True":
            edit.condition(ConditionType.STALLED, False, "NewAttempt", f"attempt {attempt} runs")
        record = None
    world_size = p.job.spec.world_size
    gang = watch(p.job.spec.health, list(p.snapshot.ranks), attempt, world_size)
    heard = {r.rank for r in p.snapshot.ranks if r.attempt == attempt and r.rank < world_size}
    left = warm_up_left(p, len(heard), world_size)
    if left > 0:
        p.plan.requeue(left, minimum=REQUEUE_MINIMUM_SECONDS)
        return
    if record is not None and not record.resolved_time:
        _follow(p, record, gang)
        return
    if gang is None:
        return
    stalled_for = (now - gang.last_progress).total_seconds()
    due = gang.bound - decision_lead(gang.bound)
    if stalled_for < due:
        # A gang whose ranks all went silent wakes no pass: this one does, when it is due (to
        # the tenth of a second: the lead is all the slack the bound has).
        p.plan.requeue(due - stalled_for, minimum=REQUEUE_MINIMUM_SECONDS)
        return
    _detect(p, gang, stalled_for=stalled_for)


def _rank_text(rank: RankSample) -> str:
    return (
        f"rank {rank.rank} on {rank.node or 'an unknown node'} "
        f"(step {rank.step} since {timestamp(rank.started)})"
    )


def _stopped_rank(rank: RankSample) -> StoppedRank:
    """A rank that stopped first, its node named only when it is known."""
    stopped = StoppedRank(rank=rank.rank, step=rank.step, step_start_time=timestamp(rank.started))
    return stopped.model_copy(update={"node": rank.node}) if rank.node else stopped


def _detect(p: Pass, gang: Watch, *, stalled_for: float) -> None:
    job, attempt, now = p.job, p.status.attempt, p.now
    named, more = stopped_first(gang.ranks)
    request_id = stack_request_id(attempt, now)
    path = f"{contract.stacks_dir(job.profile_dir(attempt))}/{request_id}"
    source = (
        "spec.health.stallTimeoutSeconds"
        if job.spec.health.stall_timeout_seconds is not None
        else f"max(3 x p50 {gang.p50_ms:.0f} ms, {FLOOR_SECONDS:.0f} s)"
    )
    stopped = ", ".join(_rank_text(r) for r in named) + (f" and {more} more" if more else "")
    message = (
        f"no rank of attempt {attempt} entered a new step for {stalled_for:.0f}s (bound "
        f"{gang.bound:g}s, {source}); slowest step {gang.step}; stopped first: {stopped}"
    )
    p.status.stall = StallStatus(
        attempt=attempt,
        step=gang.step,
        max_step=gang.max_step,
        last_progress_time=timestamp(gang.last_progress),
        detected_time=timestamp(now),
        bound_seconds=round(gang.bound, 3),
        stopped_ranks=[_stopped_rank(r) for r in named],
        more_stopped_ranks=more,
        stacks=StallStacks(
            request_id=request_id,
            requested_time=timestamp(now),
            path=path,
            state="Requested",
            ranks_expected=len(gang.world),
        ),
    )
    p.status.condition(ConditionType.STALLED, True, "NoProgress", message)
    p.plan.events.append(
        EventRecord("Warning", "Stalled", f"{message}; asking every rank for its stacks ({path})")
    )
    p.plan.requeue(stack_wait_seconds(job.spec.health))


def _resumed(record: StallStatus, gang: Watch | None) -> bool:
    if gang is None:
        return False
    return gang.max_step > (record.max_step or 0) or gang.step > (record.step or 0)


def _follow(p: Pass, record: StallStatus, gang: Watch | None) -> None:
    """A detected stall: resumed, still waiting for stacks, or acted on."""
    now = p.now
    stacks = (
        record.stacks if record.stacks is not None and record.stacks.state == "Requested" else None
    )
    if _resumed(record, gang):
        assert gang is not None
        if stacks is not None:
            record = record.model_copy(update={"stacks": _stacks_done(p, stacks, gang)})
        p.status.stall = record.model_copy(update={"resolved_time": timestamp(now)})
        message = f"a rank entered step {gang.max_step} after the stall at step {record.step}"
        p.status.condition(ConditionType.STALLED, False, "ProgressResumed", message)
        p.plan.events.append(EventRecord("Normal", "ProgressResumed", message))
        return
    if stacks is not None:
        requested = parse_time(stacks.requested_time) or now
        until = requested + timedelta(seconds=stack_wait_seconds(p.job.spec.health))
        answered = _answered(gang, stacks)
        expected = gang.world if gang is not None else set()
        if (not expected or not expected <= answered) and now < until:
            p.plan.requeue((until - now).total_seconds())
            return
        record = record.model_copy(update={"stacks": _stacks_done(p, stacks, gang)})
        p.status.stall = record
    if record.action is None:
        _act(p, record)


def _answered(gang: Watch | None, stacks: StallStacks) -> set[int]:
    if gang is None:
        return set()
    return {r.rank for r in gang.ranks if r.stacks_dumped == stacks.request_id}


def _stacks_done(p: Pass, stacks: StallStacks, gang: Watch | None) -> StallStacks:
    """The requested stacks as far as they came, with one event saying so."""
    expected = gang.world if gang is not None else set()
    answered = _answered(gang, stacks) & expected
    missing = sorted(expected - answered)
    state = "Captured" if not missing and answered else "Partial" if answered else "Missing"
    message = f"{len(answered)}/{len(expected)} ranks wrote their Python stacks to {stacks.path}"
    if missing:
        listed = ", ".join(map(str, missing[:LISTED_MISSING]))
        more = f" and {len(missing) - LISTED_MISSING} more" if len(missing) > LISTED_MISSING else ""
        message += f"; no answer from rank {listed}{more}"
    p.plan.events.append(
        EventRecord("Normal" if state == "Captured" else "Warning", "StacksCaptured", message)
    )
    return stacks.model_copy(
        update={
            "state": state,
            "ranks_expected": len(expected),
            "ranks_captured": len(answered),
            "missing_ranks": missing[:LISTED_MISSING],
            "complete_time": timestamp(p.now),
        }
    )


def _act(p: Pass, record: StallStatus) -> None:
    """spec.health.onStall, once."""
    job, status, decision, observed = p.job, p.status, p.plan, p.observed
    action = job.spec.health.on_stall
    status.stall = record.model_copy(
        update={"action": action.value, "action_time": timestamp(observed.now)}
    )
    if action is StallAction.REPORT:
        return
    condition = status.condition_of(ConditionType.STALLED)
    message = (condition.message if condition is not None else None) or "the gang stalled"
    if action is StallAction.FAIL:
        status.finish(Phase.FAILED, "StallTimeout", f"{message}; spec.health.onStall is Fail")
        cleanup_on_finish(job, decision, observed)
        return
    limit = job.spec.health.max_stall_restarts
    if status.restarts.stall >= limit:
        status.finish(
            Phase.FAILED,
            "StallRestartLimitExceeded",
            f"{message}; spec.health.maxStallRestarts ({limit}) exhausted",
        )
        cleanup_on_finish(job, decision, observed)
        return
    attempt = record.attempt if record.attempt is not None else status.attempt
    first = record.stopped_ranks[0].node if record.stopped_ranks else None
    failure = Failure(FailureClass.STALL, Stage.TRAIN, "Stalled", message, node=first or None)
    restart_for(p, failure, "stall", attempt=attempt)
    status.condition(
        ConditionType.STALLED,
        False,
        "GangRestarted",
        f"attempt {attempt} stalled; restarting the gang as attempt {attempt + 1}",
    )

"""status.goodput: where a job's wall time went, as one percentage and its parts. Pure.

Wall time, from the job's creation to now (or to its end), is split by phase:
Pending -> queued, Compiling -> compiling, Training -> training, Restarting -> restarting,
Suspended -> suspended. A gang whose preflight failed (spec.preflight) trained nothing: when it
stops, the seconds its check ran move from its stage's part to preflight; a passed check's
seconds move there once its gang's first pod ended (status.preflight.passed). When a gang that
trained stops for a restart or a suspend, the work
since its last complete checkpoint is lost: (status.progress.step - lastCheckpointStep) x the
recent p50 step time moves from training to lost. Without a reported checkpoint step (or step
time) the lost work is unknown: it stays in training and `lostUnknown` counts the restart, so
the percentage is then an upper bound. Goodput = kept training / (wall - suspended).

Restart-safe by construction: the figures are a ledger in the status itself, accounted up to
`asOf`. Each update adds the seconds from the stored `asOf` to now to the bucket of the stored
phase (the phase the job was in since the status was last written: every phase change is a
status write, and every status write updates the ledger), then moves `asOf` to now. Nothing
lives in the operator's memory, so an operator restart neither loses time nor counts it twice;
a write that fails (a conflict) leaves the stored ledger as it was for the next pass. Both
times are whole seconds (as every status time), so the parts sum to wallSeconds exactly, up to
the tenth-of-a-second rounding of lost work.

Writes: none of its own. The ledger is brought up to date only when the pass writes the status
anyway (a phase change, progress, a condition): moving `asOf` alone is never a reason to write,
so thousands of quiet queued jobs cost the API server nothing. The stored figures are therefore
as of `asOf`, however old; since the stored phase holds from `asOf` on, a reader takes them to
now exactly as the next write will (`figures_at`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from trainium_operator.api.objects import Obj
from trainium_operator.api.status import (
    TERMINAL_PHASES,
    GoodputStatus,
    Phase,
    ProgressStatus,
    known_fields,
)
from trainium_operator.lifecycle.observed import parse_time
from trainium_operator.lifecycle.status_edit import Section, dump, timestamp

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

# The part of the wall time each phase's seconds go to (GoodputStatus's field names).
BUCKETS = {
    Phase.PENDING: "queued_seconds",
    Phase.COMPILING: "compiling_seconds",
    Phase.TRAINING: "training_seconds",
    Phase.RESTARTING: "restarting_seconds",
    Phase.SUSPENDED: "suspended_seconds",
}
_PART_FIELDS = (*BUCKETS.values(), "preflight_seconds", "lost_seconds")
# The parts as stored (camelCase): they sum to wallSeconds.
PARTS = tuple(GoodputStatus.model_fields[name].alias or name for name in _PART_FIELDS)
# Entering one of these stops the gang; the next resumes from the newest checkpoint.
STOPPING = frozenset({Phase.RESTARTING, Phase.SUSPENDED})


@dataclass(frozen=True, slots=True)
class JobState:
    """What the ledger reads of a status: the phase, the gang attempt and its progress."""

    phase: Phase | None
    attempt: int  # 0 when unset
    progress: ProgressStatus | None
    # (attempt, seconds) of the latest failed preflight (status.preflight), if any.
    preflight: tuple[int, float] | None = None
    # (attempt, stage, seconds) of the latest gang whose preflight passed, if any.
    preflight_passed: tuple[int, str, float] | None = None

    @classmethod
    def of(cls, status: Obj) -> JobState:
        phase, progress = status.get("phase"), status.get("progress")
        record = status.get("preflight") or {}
        failed = (
            (int(record["attempt"]), float(record.get("seconds") or 0.0))
            if record.get("attempt") is not None and record.get("outcome")
            else None
        )
        passed = record.get("passed") or {}
        return cls(
            Phase(phase) if phase else None,
            int(status.get("attempt") or 0),
            _read(ProgressStatus, progress) if progress else None,
            failed,
            (int(passed["attempt"]), str(passed["stage"]), float(passed["seconds"]))
            if passed.get("attempt") is not None
            else None,
        )


def _read(model: type[Section], stored: Obj) -> Section:
    """A section of a status as stored, without the fields another operator version wrote that
    this one does not know (as `StatusEdit` reads the rest)."""
    return model.model_validate(known_fields(stored, model))


def _whole_seconds(moment: datetime) -> datetime:
    """`moment` at the status's resolution, so stored and computed times agree."""
    parsed = parse_time(timestamp(moment))
    assert parsed is not None
    return parsed


def lost_work_seconds(progress: ProgressStatus | None, attempt: int) -> float | None:
    """The work a stopped gang of `attempt` loses: its steps after the last complete
    checkpoint (up to the one in progress) at the recent p50 step time; None: not known."""
    if progress is None or progress.attempt != attempt:
        return None
    step, checkpoint, p50_ms = (
        progress.step,
        progress.last_checkpoint_step,
        progress.step_time_p50_ms,
    )
    if step is None or checkpoint is None or not p50_ms:
        return None
    return max(step - checkpoint, 0) * p50_ms / 1000.0


def opened(start: datetime, attempt: int) -> GoodputStatus:
    """A ledger with nothing accounted yet, beginning at `start`."""
    moment = timestamp(start)
    return GoodputStatus(
        **dict.fromkeys(_PART_FIELDS, 0.0),
        wall_seconds=0.0,
        lost_unknown=0,
        attempt=attempt,
        attempt_training_seconds=0.0,
        start_time=moment,
        as_of=moment,
    )


def accounted(
    ledger: GoodputStatus, previous: JobState, status: JobState, now: datetime
) -> GoodputStatus:
    """`ledger` (stored with `previous`) brought up to `now`, `status` being the new status."""
    # A ledger an older operator wrote may miss fields: those of a new one stand in.
    ledger = opened(now, 0).model_copy(update=ledger.model_dump(exclude_unset=True))
    as_of = parse_time(ledger.as_of) or _whole_seconds(now)
    start = parse_time(ledger.start_time) or as_of
    # Never backwards: a new operator whose clock is behind the last one's adds nothing.
    end = max(as_of, _whole_seconds(now))
    elapsed = (end - as_of).total_seconds()
    before, attempt = previous.phase or Phase.PENDING, previous.attempt
    bucket = BUCKETS.get(before, "queued_seconds")
    ledger = ledger.model_copy(update={bucket: getattr(ledger, bucket) + elapsed})
    training, lost, lost_unknown = ledger.training_seconds, ledger.lost_seconds, ledger.lost_unknown
    attempt_training = ledger.attempt_training_seconds if ledger.attempt == attempt else 0.0
    if before is Phase.TRAINING:
        attempt_training += elapsed
    if status.preflight_passed is not None and status.preflight_passed != previous.preflight_passed:
        # A passed check ran inside its stage's gang: its seconds move out of that stage's part.
        _, stage, seconds = status.preflight_passed
        part = "compiling_seconds" if stage == "compile" else "training_seconds"
        ledger = _to_preflight(ledger, part, seconds)
        training = ledger.training_seconds
    stopping = status.phase in STOPPING and before not in STOPPING
    preflight_failed = status.preflight is not None and status.preflight[0] == attempt
    if stopping and preflight_failed and status.preflight != previous.preflight:
        # The gang checked its nodes and trained nothing: no work lost, the check's time moves.
        assert status.preflight is not None
        ledger = _to_preflight(ledger, bucket, status.preflight[1])
        training = ledger.training_seconds
        attempt_training = 0.0
    elif stopping and attempt_training > 0:
        # This pass's progress: as fresh as the stored one, or fresher.
        charged = lost_work_seconds(status.progress or previous.progress, attempt)
        if charged is None:
            lost_unknown += 1
        else:
            charged = min(charged, attempt_training, training)
            training, lost = training - charged, lost + charged
        attempt_training = 0.0  # charged once: the next attempt starts afresh
    next_attempt = status.attempt or attempt
    if next_attempt != attempt:
        attempt_training = 0.0
    parts = ledger.model_copy(update={"training_seconds": training, "lost_seconds": lost})
    figures = GoodputStatus(
        **{name: round(float(getattr(parts, name)), 1) for name in _PART_FIELDS},
        wall_seconds=(end - start).total_seconds(),
        lost_unknown=lost_unknown,
        attempt=next_attempt,
        attempt_training_seconds=round(float(attempt_training), 1),
        start_time=ledger.start_time,
        as_of=timestamp(end),
    )
    counted = figures.wall_seconds - figures.suspended_seconds
    if counted <= 0:
        return figures  # no percent yet: nothing to divide by
    percent = round(100.0 * figures.training_seconds / counted, 1)
    summary = f"{'<=' if lost_unknown else ''}{percent:.1f}%"
    return figures.model_copy(update={"percent": percent, "summary": summary})


def _to_preflight(ledger: GoodputStatus, part: str, seconds: float) -> GoodputStatus:
    """`ledger` with `seconds` (at most what `part` holds) moved from `part` to preflight."""
    moved = min(seconds, getattr(ledger, part))
    return ledger.model_copy(
        update={
            part: getattr(ledger, part) - moved,
            "preflight_seconds": ledger.preflight_seconds + moved,
        }
    )


def figures_at(status: Obj, now: datetime) -> Obj | None:
    """A reader's status.goodput as of `now`: the stored figures (as of their asOf) with the
    time since in the stored phase, what a status write at `now` would store; a finished job's
    as they are; None without a ledger."""
    stored: Obj | None = status.get("goodput")
    state = JobState.of(status)
    if stored is None or state.phase in TERMINAL_PHASES:
        return stored
    return dump(accounted(_read(GoodputStatus, stored), state, state, now))


def goodput(p: Pass) -> None:
    """status.goodput brought up to now when this pass writes the status anyway."""
    ledger = goodput_of(p.snapshot.status, p.status.data, p.now, p.snapshot.created)
    if ledger is not None:
        p.status.goodput = ledger


def with_goodput(previous: Obj, status: Obj, now: datetime, created: datetime | None) -> Obj:
    """`status` (this pass's new status; `previous` is the stored one) with its status.goodput
    as `goodput_of` says."""
    ledger = goodput_of(previous, status, now, created)
    return status if ledger is None else {**status, "goodput": dump(ledger)}


def goodput_of(
    previous: Obj, status: Obj, now: datetime, created: datetime | None
) -> GoodputStatus | None:
    """The status.goodput of `status` (this pass's new status; `previous` is the stored one):
    brought up to `now` when the pass writes the status anyway; otherwise the stored figures,
    unchanged (no write only to move asOf); None: the job has none (it finished before goodput
    was accounted: its history is unknown). `created`: the job's
    metadata.creationTimestamp, where a new job's accounting begins."""
    stored_figures: Obj | None = previous.get("goodput")
    before = JobState.of(previous)
    if stored_figures is None:
        if before.phase in TERMINAL_PHASES:
            return None
        # A new job counts from its creation (the time before the operator first saw it was
        # queued); one an older operator already ran counts from now.
        start = created if before.phase is None and created is not None else now
        stored = opened(min(start, now), before.attempt)
    else:
        stored = _read(GoodputStatus, stored_figures)
        if before.phase in TERMINAL_PHASES:
            return stored  # accounted up to the end, once
        if _without_goodput(status) == _without_goodput(previous):
            return stored
    return accounted(stored, before, JobState.of(status), now)


def _without_goodput(status: Obj) -> Obj:
    return {key: value for key, value in status.items() if key != "goodput"}

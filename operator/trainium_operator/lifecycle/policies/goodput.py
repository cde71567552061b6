"""status.goodput: where a job's wall time went, as one percentage and its parts. Pure.

Wall time, from the job's creation to now (or to its end), is split by phase:
Pending -> queued, Compiling -> compiling, Training -> training, Restarting -> restarting,
Suspended -> suspended. When a gang that trained stops for a restart or a suspend, the work
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

from datetime import datetime
from typing import TYPE_CHECKING, Any

from trainium_operator.api.status import TERMINAL_PHASES, Phase
from trainium_operator.lifecycle.observed import parse_time
from trainium_operator.lifecycle.status_edit import timestamp

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

Obj = dict[str, Any]
BUCKETS = {
    Phase.PENDING: "queuedSeconds",
    Phase.COMPILING: "compilingSeconds",
    Phase.TRAINING: "trainingSeconds",
    Phase.RESTARTING: "restartingSeconds",
    Phase.SUSPENDED: "suspendedSeconds",
}
PARTS = (*BUCKETS.values(), "lostSeconds")
# Entering one of these stops the gang; the next resumes from the newest checkpoint.
STOPPING = frozenset({Phase.RESTARTING, Phase.SUSPENDED})


def _phase(status: Obj) -> Phase | None:
    value = status.get("phase")
    return Phase(value) if value else None


def _whole_seconds(moment: datetime) -> datetime:
    """`moment` at the status's resolution, so stored and computed times agree."""
    parsed = parse_time(timestamp(moment))
    assert parsed is not None
    return parsed


def lost_work_seconds(progress: Obj | None, attempt: int) -> float | None:
    """The work a stopped gang of `attempt` loses: its steps after the last complete
    checkpoint (up to the one in progress) at the recent p50 step time; None: not known."""
    if not progress or progress.get("attempt") != attempt:
        return None
    step = progress.get("step")
    checkpoint = progress.get("lastCheckpointStep")
    p50_ms = progress.get("stepTimeP50Ms")
    if step is None or checkpoint is None or not p50_ms:
        return None
    return max(int(step) - int(checkpoint), 0) * float(p50_ms) / 1000.0


def opened(start: datetime, attempt: int) -> Obj:
    """A ledger with nothing accounted yet, beginning at `start`."""
    moment = timestamp(start)
    return {
        **dict.fromkeys(PARTS, 0.0),
        "wallSeconds": 0.0,
        "lostUnknown": 0,
        "attempt": attempt,
        "attemptTrainingSeconds": 0.0,
        "startTime": moment,
        "asOf": moment,
    }


def accounted(ledger: Obj, previous: Obj, status: Obj, now: datetime) -> Obj:
    """`ledger` (stored with `previous`) brought up to `now`, `status` being the new status."""
    out = {**opened(now, 0), **ledger}
    as_of = parse_time(out["asOf"]) or _whole_seconds(now)
    start = parse_time(out["startTime"]) or as_of
    # Never backwards: a new operator whose clock is behind the last one's adds nothing.
    end = max(as_of, _whole_seconds(now))
    elapsed = (end - as_of).total_seconds()
    before = _phase(previous) or Phase.PENDING
    attempt = int(previous.get("attempt") or 0)
    if out["attempt"] != attempt:
        out["attempt"], out["attemptTrainingSeconds"] = attempt, 0.0
    out[BUCKETS.get(before, "queuedSeconds")] += elapsed
    if before is Phase.TRAINING:
        out["attemptTrainingSeconds"] += elapsed
    after = _phase(status)
    if after in STOPPING and before not in STOPPING and out["attemptTrainingSeconds"] > 0:
        # This pass's progress: as fresh as the stored one, or fresher.
        lost = lost_work_seconds(status.get("progress") or previous.get("progress"), attempt)
        if lost is None:
            out["lostUnknown"] += 1
        else:
            lost = min(lost, out["attemptTrainingSeconds"], out["trainingSeconds"])
            out["trainingSeconds"] -= lost
            out["lostSeconds"] += lost
        out["attemptTrainingSeconds"] = 0.0  # charged once: the next attempt starts afresh
    next_attempt = int(status.get("attempt") or attempt)
    if next_attempt != out["attempt"]:
        out["attempt"], out["attemptTrainingSeconds"] = next_attempt, 0.0
    for key in (*PARTS, "attemptTrainingSeconds"):
        out[key] = round(float(out[key]), 1)
    out["wallSeconds"] = (end - start).total_seconds()
    out["asOf"] = timestamp(end)
    counted = out["wallSeconds"] - out["suspendedSeconds"]
    out.pop("percent", None)
    out.pop("summary", None)
    if counted > 0:
        percent = round(100.0 * out["trainingSeconds"] / counted, 1)
        out["percent"] = percent
        out["summary"] = f"{'<=' if out['lostUnknown'] else ''}{percent:.1f}%"
    return out


def figures_at(status: Obj, now: datetime) -> Obj | None:
    """A reader's status.goodput as of `now`: the stored figures (as of their asOf) with the
    time since in the stored phase, what a status write at `now` would store; a finished job's
    as they are; None without a ledger."""
    stored: Obj | None = status.get("goodput")
    if stored is None or _phase(status) in TERMINAL_PHASES:
        return stored
    return accounted(stored, status, status, now)


def goodput(p: Pass) -> None:
    """status.goodput brought up to now when this pass writes the status anyway."""
    p.status.data = with_goodput(p.snapshot.status, p.status.data, p.now, p.snapshot.created)


def with_goodput(previous: Obj, status: Obj, now: datetime, created: datetime | None) -> Obj:
    """`status` (this pass's new status; `previous` is the stored one) with status.goodput
    brought up to `now` when the pass writes the status anyway; otherwise with the stored
    figures, unchanged (no write only to move asOf). `created`: the job's
    metadata.creationTimestamp, where a new job's accounting begins."""
    stored: Obj | None = previous.get("goodput")
    before = _phase(previous)
    if stored is None:
        if before in TERMINAL_PHASES:
            return status  # finished before goodput was accounted: its history is unknown
        # A new job counts from its creation (the time before the operator first saw it was
        # queued); one an older operator already ran counts from now.
        start = created if before is None and created is not None else now
        stored = opened(min(start, now), int(previous.get("attempt") or 0))
    elif before in TERMINAL_PHASES:
        return {**status, "goodput": stored}  # accounted up to the end, once
    else:
        others = {k: v for k, v in status.items() if k != "goodput"}
        if others == {k: v for k, v in previous.items() if k != "goodput"}:
            return {**status, "goodput": stored}
    return {**status, "goodput": accounted(stored, previous, status, now)}

"""status.progress from the ranks' newest health-channel messages: one pure policy.

The operator keeps each rank's newest message in memory (controller/health_server.py); a
reconcile pass hands them here with the status the machine decided. Figures are written at
most once per 0.8 x `interval` seconds per job (the previous `updateTime` bounds it), so however
many ranks report and however often, progress costs the API server at most 75/interval writes
a minute per job (7.5 at the default 10 s; the operator's timer wakes the job every interval).

- step: the slowest rank's current step (and the fastest's, `maxStep`);
- stepTimeP50Ms: the median of every rank's latest (up to 16) step times;
- stepsPerSecond: 1000 / p50 (a gang steps together);
- samples/tokens per second: each rank's cumulative count per step it has done, times
  stepsPerSecond, summed over the ranks (an approximation: it assumes steady batch sizes);
- eta: now + (totalSteps - step) x p50, when spec.health.totalSteps is set;
- lastCheckpointStep: the lowest newest-checkpoint step of the ranks that report one
  (profiler.checkpoint_saved), which status.goodput charges a restart's lost work from.
"""

from __future__ import annotations

import statistics
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from trainium_operator.api.status import Phase
from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.observed import parse_time
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.status_edit import timestamp as format_time

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

Obj = dict[str, Any]
RECENT_STEPS = 16


def recent_p50_ms(ranks: list[RankSample]) -> float | None:
    """The median of the ranks' latest (up to RECENT_STEPS) step times; None before any."""
    times = [t for r in ranks for t in r.step_times_ms[-RECENT_STEPS:]]
    return statistics.median(times) if times else None


def duration_text(seconds: float) -> str:
    """12s, 5m, 3h20m, 2d4h: what the ETA column shows."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m" if minutes else f"{hours}h"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours}h"


def _rate(per_step: list[float], steps_per_second: float | None) -> float | None:
    if not per_step or steps_per_second is None:
        return None
    return round(sum(per_step) * steps_per_second, 3)


def progress_figures(
    job: JobRef, ranks: list[RankSample], previous: Obj | None, attempt: int, now: datetime
) -> Obj | None:
    """The new status.progress, or None when there is nothing (new) to say."""
    current = [r for r in ranks if r.attempt == attempt and r.step >= 0]
    if not current:
        return None
    slowest = min(current, key=lambda r: (r.step, r.rank))
    fastest = max(current, key=lambda r: (r.step, -r.rank))
    p50 = recent_p50_ms(current)
    steps_per_second = 1000.0 / p50 if p50 else None
    samples = [r.samples / max(r.step, 1) for r in current if r.samples is not None]
    tokens = [r.tokens / max(r.step, 1) for r in current if r.tokens is not None]
    total = job.spec.health.total_steps
    out: Obj = {
        "attempt": attempt,
        "step": slowest.step,
        "maxStep": fastest.step,
        "slowestRank": slowest.rank,
        "fastestRank": fastest.rank,
        "ranksReporting": len(current),
        "worldSize": max(r.world_size for r in current),
        "lastProgressTime": format_time(max(r.received for r in current)),
        "updateTime": format_time(now),
        "stepSummary": f"{slowest.step}/{total}" if total else str(slowest.step),
    }
    if previous and previous.get("attempt") == attempt and previous.get("step", -1) > slowest.step:
        return None  # a late message of a restarted rank: keep what was said
    if previous and previous.get("attempt") == attempt and previous.get("step") == slowest.step:
        out["lastProgressTime"] = previous.get("lastProgressTime", out["lastProgressTime"])
    if total:
        out["totalSteps"] = total
    if p50 is not None and steps_per_second is not None:
        out["stepTimeP50Ms"] = round(p50, 3)
        out["stepsPerSecond"] = round(steps_per_second, 4)
        out["rateSummary"] = f"{steps_per_second:.3g} steps/s"
        if total:
            left = max(total - slowest.step, 0) * p50 / 1000.0
            out["eta"] = format_time(now + timedelta(seconds=left))
            out["etaSummary"] = duration_text(left)
    checkpoints = [r.last_checkpoint_step for r in current if r.last_checkpoint_step is not None]
    if checkpoints:
        # The gang resumes from a checkpoint every reporting rank has completed.
        out["lastCheckpointStep"] = min(checkpoints)
    for key, value in (
        ("samplesPerSecond", _rate(samples, steps_per_second)),
        ("tokensPerSecond", _rate(tokens, steps_per_second)),
    ):
        if value is not None:
            out[key] = value
    return out


def progress(p: Pass) -> None:
    """status.progress brought up to date, at most once per the operator's progress interval.
    Only a training job's progress moves; a finished or restarting job keeps its last figures."""
    if p.snapshot.ranks is None:
        return
    status = p.status.data
    if status.get("phase") != Phase.TRAINING.value:
        return
    previous = status.get("progress")
    attempt = int(status.get("attempt") or 0)
    if previous and previous.get("attempt") == attempt:
        updated = parse_time(previous.get("updateTime"))
        # 0.8: the pass the operator's timer wakes every `interval` must not just miss it.
        interval = p.snapshot.settings.progress_interval
        if updated is not None and (p.now - updated).total_seconds() < 0.8 * interval:
            return
    figures = progress_figures(p.job, list(p.snapshot.ranks), previous, attempt, p.now)
    if figures is not None:
        status["progress"] = figures

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

An operator that has just begun keeping messages (it started, or took over from another
replica: its store is empty) hears from the ranks one by one. Each message carries its rank's
step and recent step times, so a rank heard again restores its figures; until as many ranks
reported as the status last counted (or `warm_up_left` ran out), the figures already written
stay as they are rather than be replaced by a part of the gang's.
"""

from __future__ import annotations

import statistics
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from trainium_operator.api.status import Phase, ProgressStatus
from trainium_operator.lifecycle.observed import parse_time
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.status_edit import timestamp as format_time

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

RECENT_STEPS = 16
# How long after the operator began keeping messages some ranks may still be unheard: each
# reports every spec.health.reportIntervalSeconds and retries a failed send at the same
# interval, at least a second apart (profiler/channel.py); one interval more for a loaded node,
# and the margin covers that second and a retry after a standby's 503.
WARM_UP_INTERVALS = 2.0
WARM_UP_MARGIN_SECONDS = 2.0


def warm_up_left(p: Pass, heard: int, expected: int) -> float:
    """Seconds during which `heard` ranks of `expected` may be only those that reported since
    the operator began keeping messages (`Snapshot.ranks_since`); 0: as complete as they get."""
    since = p.snapshot.ranks_since
    if since is None or heard >= expected:
        return 0.0
    window = WARM_UP_INTERVALS * p.job.spec.health.report_interval_seconds
    return max(window + WARM_UP_MARGIN_SECONDS - (p.now - since).total_seconds(), 0.0)


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


def _known(**fields: Any) -> dict[str, Any]:
    """The fields whose value is known, to build a status model from: one left out stays
    unset, so it is absent from the stored status (not null)."""
    return {name: value for name, value in fields.items() if value is not None}


def progress_figures(p: Pass) -> ProgressStatus | None:
    """The new status.progress from the ranks' reports, or None when there is nothing (new)
    to say."""
    previous, attempt, now = p.status.progress, p.status.attempt, p.now
    current = [r for r in p.snapshot.ranks or () if r.attempt == attempt and r.step >= 0]
    if not current:
        return None
    slowest = min(current, key=lambda r: (r.step, r.rank))
    fastest = max(current, key=lambda r: (r.step, -r.rank))
    last_progress = format_time(max(r.received for r in current))
    if previous is not None and previous.attempt == attempt:
        if (previous.step if previous.step is not None else -1) > slowest.step:
            return None  # a late message of a restarted rank: keep what was said
        if previous.step == slowest.step:
            last_progress = previous.last_progress_time or last_progress
    total = p.job.spec.health.total_steps or None
    p50 = recent_p50_ms(current)
    rate = 1000.0 / p50 if p50 else None  # steps per second
    left = max(total - slowest.step, 0) * p50 / 1000.0 if total and p50 and rate else None
    samples = [r.samples / max(r.step, 1) for r in current if r.samples is not None]
    tokens = [r.tokens / max(r.step, 1) for r in current if r.tokens is not None]
    checkpoints = [r.last_checkpoint_step for r in current if r.last_checkpoint_step is not None]
    return ProgressStatus(
        attempt=attempt,
        step=slowest.step,
        max_step=fastest.step,
        slowest_rank=slowest.rank,
        fastest_rank=fastest.rank,
        ranks_reporting=len(current),
        world_size=max(r.world_size for r in current),
        last_progress_time=last_progress,
        update_time=format_time(now),
        step_summary=f"{slowest.step}/{total}" if total else str(slowest.step),
        **_known(
            total_steps=total,
            step_time_p50_ms=round(p50, 3) if p50 and rate else None,
            steps_per_second=round(rate, 4) if rate else None,
            rate_summary=f"{rate:.3g} steps/s" if rate else None,
            eta=format_time(now + timedelta(seconds=left)) if left is not None else None,
            eta_summary=duration_text(left) if left is not None else None,
            # The gang resumes from a checkpoint every reporting rank has completed.
            last_checkpoint_step=min(checkpoints, default=None),
            samples_per_second=_rate(samples, rate),
            tokens_per_second=_rate(tokens, rate),
        ),
    )


def progress(p: Pass) -> None:
    """status.progress brought up to date, at most once per the operator's progress interval.
    Only a training job's progress moves; a finished or restarting job keeps its last figures."""
    if p.snapshot.ranks is None or p.status.phase is not Phase.TRAINING:
        return
    previous = p.status.progress
    if previous is not None and previous.attempt == p.status.attempt:
        updated = parse_time(previous.update_time)
        # 0.8: the pass the operator's timer wakes every `interval` must not just miss it.
        interval = p.snapshot.settings.progress_interval
        if updated is not None and (p.now - updated).total_seconds() < 0.8 * interval:
            return
        heard = {r.rank for r in p.snapshot.ranks if r.attempt == p.status.attempt and r.step >= 0}
        if warm_up_left(p, len(heard), previous.ranks_reporting or 0) > 0:
            return  # some ranks unheard since a start or failover: keep what was said
    figures = progress_figures(p)
    if figures is not None:
        p.status.progress = figures

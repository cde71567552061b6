"""Stragglers: ranks persistently slower than the rest of their gang. One pure policy, fed the
ranks' newest health-channel messages by the job's reconcile pass (as `stalls` is).

- Each rank's step time is the median of its latest 16 (RECENT_STEPS) step times, and only once
  it has at least MIN_STEP_TIMES of them: "persistently" means most of a 16-step window, not one
  slow step (a checkpoint, a data-loader hiccup).
- A rank is a straggler when that exceeds the median of the *other* ranks' step times by more
  than spec.health.stragglerThreshold (0.2: 20 %). Leaving the rank out keeps a two-rank gang's
  reference from being half the straggler itself.
- Written to status.stragglers only when the set of stragglers changes (a bounded number of
  writes), with a Warning event `Straggler` naming each new one, its node and how much slower
  it is, and a Normal `StragglersRecovered` once none is left.

Limit (documented): in a gang that synchronises every step (data-parallel all-reduce), every
rank's step *wall* time is the slowest rank's, so step markers alone cannot single it out; this
rule sees ranks that step independently, or a slowness that shows between collectives.
"""

from __future__ import annotations

import statistics

from trainium_operator.api.status import Phase
from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.decision import Decision, EventRecord, Obj
from trainium_operator.lifecycle.observed import Observed
from trainium_operator.lifecycle.progress import RECENT_STEPS, RankSample
from trainium_operator.lifecycle.status_edit import timestamp

MIN_STEP_TIMES = 8
LISTED = 16


def rank_step_time_ms(rank: RankSample) -> float | None:
    recent = rank.step_times_ms[-RECENT_STEPS:]
    return statistics.median(recent) if len(recent) >= MIN_STEP_TIMES else None


def stragglers(ranks: list[RankSample], threshold: float) -> tuple[list[Obj], float | None]:
    """The stragglers (slowest first) and the gang's median step time."""
    times = {r.rank: t for r in ranks if (t := rank_step_time_ms(r)) is not None}
    if len(times) < 2:
        return [], None
    nodes = {r.rank: r.node for r in ranks}
    slow: list[Obj] = []
    for number, own in times.items():
        others = statistics.median(t for n, t in times.items() if n != number)
        if others > 0 and own > (1 + threshold) * others:
            slow.append(
                {
                    "rank": number,
                    **({"node": nodes[number]} if nodes.get(number) else {}),
                    "stepTimeMs": round(own, 3),
                    "ratio": round(own / others, 3),
                }
            )
    slow.sort(key=lambda s: (-float(s["ratio"]), int(s["rank"])))
    return slow[:LISTED], statistics.median(times.values())


def apply_straggler_policy(
    job: JobRef, decision: Decision, observed: Observed, ranks: list[RankSample]
) -> None:
    threshold = job.spec.health.straggler_threshold
    status = decision.status
    if threshold is None or status.get("phase") != Phase.TRAINING.value:
        return
    attempt = int(status.get("attempt") or 0)
    current = [r for r in ranks if r.attempt == attempt and not r.final]
    slow, gang = stragglers(current, threshold)
    previous: Obj = status.get("stragglers") or {}
    before = (
        {s["rank"] for s in previous.get("ranks", [])}
        if previous.get("attempt") == attempt
        else set()
    )
    now_slow = {s["rank"] for s in slow}
    if gang is None or now_slow == before:
        return
    decision.status = {
        **status,
        "stragglers": {
            "attempt": attempt,
            "gangStepTimeMs": round(gang, 3),
            "ranks": slow,
            "updateTime": timestamp(observed.now),
        },
    }
    for entry in slow:
        if entry["rank"] in before:
            continue
        decision.events.append(
            EventRecord(
                "Warning",
                "Straggler",
                f"rank {entry['rank']} on {entry.get('node') or 'an unknown node'} steps in "
                f"{entry['stepTimeMs']:.0f} ms, {100 * (entry['ratio'] - 1):.0f} % slower than "
                f"the other ranks' median (spec.health.stragglerThreshold {threshold:g})",
            )
        )
    if not slow:
        decision.events.append(
            EventRecord("Normal", "StragglersRecovered", "no rank is slower than the threshold")
        )

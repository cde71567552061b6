"""The straggler check as it was before it was made linear (issue 29 item 6), kept verbatim as
the reference its replacement must agree with (tests/unit/test_stragglers.py) and the "before"
figure of tests/bench/bench_stragglers.py: for every rank, the median of all the other ranks'
step times, recomputed from scratch (O(ranks^2))."""

from __future__ import annotations

import statistics
from typing import Any

from trainium_operator.lifecycle.policies.stragglers import LISTED, rank_step_time_ms
from trainium_operator.lifecycle.ranks import RankSample

Obj = dict[str, Any]


def quadratic_stragglers(
    ranks: list[RankSample], threshold: float
) -> tuple[list[Obj], float | None]:
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

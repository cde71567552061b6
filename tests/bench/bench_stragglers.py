"""Straggler check benchmark, in one process: run `python tests/bench/bench_stragglers.py`.

Prints, for gangs of 4096 and 16 384 ranks (each with 16 step times, ~1 % of them 50 % slow),
the CPU time of one straggler check: "before", the quadratic check it replaced
(tests/unit/stragglers_quadratic.py: every rank's reference recomputed from all the others),
and "after", `lifecycle.policies.stragglers.stragglers` as a reconcile pass runs it
(onStraggler: Report, the status record included), with the ratio measured in the same run.
Target: <= 20 ms per pass at 4096 ranks. Each figure is the best of a few runs (the machine is
shared); the quadratic check at 16 384 ranks takes tens of seconds, so it is measured only with
--full (otherwise projected as 16 x its 4096-rank time).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "operator"), str(ROOT / "tests")]

from trainium_operator.lifecycle.observed import Observed  # noqa: E402
from trainium_operator.lifecycle.policies.stragglers import stragglers  # noqa: E402
from trainium_operator.lifecycle.ranks import RankSample  # noqa: E402
from unit.jobs import job_ref, run_policy  # noqa: E402
from unit.stragglers_quadratic import quadratic_stragglers  # noqa: E402

NOW = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)
TARGET_MS = 20.0
RANKS_PER_NODE = 32  # trn1.32xlarge


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def gang(size: int) -> list[RankSample]:
    generator = random.Random(size)
    return [
        RankSample(
            number,
            0,
            size,
            1000,
            tuple(
                (75.0 if number % 97 == 5 else 50.0) * generator.uniform(0.95, 1.05)
                for _ in range(16)
            ),
            NOW,
            node=f"node-{number // RANKS_PER_NODE}",
        )
        for number in range(size)
    ]


def best_ms(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best * 1000


def check_after(size: int, ranks: list[RankSample]) -> Callable[[], object]:
    job = job_ref(nodes=size // RANKS_PER_NODE)
    observed = Observed((), {}, True, {}, NOW)

    def run() -> object:
        status = {"phase": "Training", "attempt": 0}
        return run_policy(stragglers, job, status, observed, ranks=tuple(ranks))

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--full", action="store_true", help="measure the 16 384-rank before")
    args = parser.parse_args()
    print("straggler check, CPU ms per pass (best of several runs)")
    before_4096 = 0.0
    for size in (4096, 16384):
        ranks = gang(size)
        after = best_ms(check_after(size, ranks), repeats=7)
        if size == 4096 or args.full:
            before = best_ms(lambda ranks=ranks: quadratic_stragglers(ranks, 0.2), repeats=1)
            label = "measured"
        else:
            before = before_4096 * (size / 4096) ** 2
            label = "projected, --full measures it"
        before_4096 = before if size == 4096 else before_4096
        print(
            f"   {size:>5} ranks: before {before:9.1f} ms ({label}), after {after:6.2f} ms, "
            f"{before / after:,.0f}x faster"
        )
        if size == 4096:
            print(f"   target <= {TARGET_MS:g} ms at 4096 ranks: {verdict(after <= TARGET_MS)}")


if __name__ == "__main__":
    main()

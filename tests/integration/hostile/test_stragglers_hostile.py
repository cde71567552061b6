"""Hostile tenant vs the straggler check (lifecycle/stragglers.py): a process of a job's own pod,
with the pod's genuine token, claims a rank number outside the job's world (nodes x
processesPerNode), slow, to be named a straggler: once with the job's true world size, once
with a world size of its own. The health channel refuses both (the rank is not the pod's node's,
the world is not the spec's), and the straggler check, which counts only the spec's ranks, names
only the honest slow rank."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.health_ranks import (
    fast_health_operator,
    outcome,
    rank_env,
    ranks_with_a_straggler,
    reporting_job,
    start_rank,
)
from integration.operator_harness import (
    OperatorProcess,
    events_with_reason,
    get_job,
)
from trainium_devcluster.sim import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]


@pytest.fixture(scope="module")
def shared_operator(
    dev_cluster: Any, crds: None, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> Iterator[OperatorProcess]:
    """This module's operator serves the health channel and wakes jobs every 0.5 s."""
    log_dir = tmp_path_factory.mktemp("straggler-hostile-operator")
    with fast_health_operator(dev_cluster, request.module.__name__, log_dir) as proc:
        yield proc


def test_ranks_claiming_numbers_outside_the_jobs_world_are_never_named_stragglers(
    dev_cluster: Any, namespace: str, operator: Any, tmp_path: Path, hostile_report: Any
) -> None:
    clients = dev_cluster.clients
    pod, token = reporting_job(clients, namespace, "forged", tmp_path, processes=3)
    # The job's world is 1 node x 3 processes; rank 2 is really slow.
    honest = ranks_with_a_straggler(pod, token, 160)
    forged = {
        (rank, world): start_rank(rank_env(pod, token, rank, world), 160, 0.5)
        for rank, world in ((5000, 3), (5000, 5001))
    }
    seen: dict[str, Any] = {}
    try:
        # Near the honest ranks' end (~7 s), the forged ones have 14 step times: a full verdict.
        seen = wait_for(
            lambda: {"status": get_job(clients, namespace, "forged").get("status") or {}},
            until=lambda job: (job["status"].get("progress") or {}).get("maxStep", 0) >= 140,
            timeout=60,
            description="forged: the honest ranks near their end",
        )
    finally:
        for process in honest:
            outcome(process)
        for process in forged.values():
            process.kill()
            process.communicate()
        status = seen.get("status") or {}
        flagged = [r["rank"] for r in (status.get("stragglers") or {}).get("ranks", [])]
        for rank, world in forged:
            hostile_report.tried(
                "health channel: rank number",
                f"rank {rank} (world {world}), 10x the step time",
                "no status progress (writes failing?)"
                if not status
                else "named a straggler"
                if rank in flagged
                else f"refused (outside the spec's world of 3); named: {flagged}",
            )
    assert flagged == [2], status["stragglers"]
    warnings = [e[2] for e in events_with_reason(clients, namespace, "forged", "Straggler")]
    assert (status.get("progress") or {}).get("ranksReporting", 0) <= 3
    assert len(warnings) == 1, warnings
    assert status["phase"] == "Training"

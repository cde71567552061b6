"""Hang detection on the dev cluster: a frozen rank (ranks are local processes using the public
profiler API as their pods, authenticated by pod-bound tokens, as in test_health_channel.py).

Three one-node jobs run at once under this module's operator (one node more than the session's
two), one per spec.health.onStall action; in each, of the pod's two ranks, rank 0 freezes in
step 20 and rank 1 waits for it in step 21 (as in a collective). Each job must
be Stalled within its bound, name rank 0 as the one that stopped first, have both ranks' Python
stacks in its profile directory, and then take its action.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.health_ranks import (
    fast_health_operator,
    local_stacks,
    outcome,
    pod_token,
    rank_env,
    ranks_with_a_straggler,
    reporting_job,
    start_freezing_rank,
    start_rank,
    wait_account,
)
from integration.operator_harness import (
    OperatorProcess,
    create_job,
    events_with_reason,
    get_job,
    job_manifest,
    wait_gang_running,
    wait_phase,
)
from trainium_devcluster import testing
from trainium_devcluster.sim import wait_for
from trainium_operator.lifecycle.observed import parse_time

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

STALL_TIMEOUT_S = 2
INTERVAL_S = 0.2
STEPS, STEP_S, FREEZE_AT = 60, 0.05, 20
CORDON_BUDGET = 1


@pytest.fixture(scope="module")
def shared_operator(
    dev_cluster: Any, crds: None, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> Iterator[OperatorProcess]:
    """This module's operator serves the health channel, wakes jobs every 0.5 s and may keep
    one node cordoned for stragglers (the operator admin's opt-in)."""
    log_dir = tmp_path_factory.mktemp("stall-operator")
    budget = ("--straggler-cordon-budget", str(CORDON_BUDGET))
    with fast_health_operator(dev_cluster, request.module.__name__, log_dir, budget) as proc:
        yield proc


def stall_of(clients: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict((get_job(clients, namespace, name).get("status") or {}).get("stall") or {})


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    conditions = (job.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == kind), {})


def test_a_frozen_rank_is_stalled_within_its_bound_with_stacks_then_each_on_stall_action(
    dev_cluster: Any, namespace: str, operator: Any, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    with testing.extra_nodes(dev_cluster, 1):
        _each_action(clients, namespace, tmp_path)


def _each_action(clients: Any, namespace: str, tmp_path: Path) -> None:
    actions = {"report": "Report", "restart": "Restart", "fail": "Fail"}
    for name, action in actions.items():
        health = {
            "reportIntervalSeconds": INTERVAL_S,
            "stallTimeoutSeconds": STALL_TIMEOUT_S,
            "onStall": action,
        }
        manifest = job_manifest(
            name, nodes=1, processesPerNode=2, compile={"enabled": False}, health=health
        )
        create_job(clients, namespace, manifest)
    wait_account(clients, namespace)
    release = tmp_path / "release"
    ranks: dict[str, list[subprocess.Popen[str]]] = {}
    nodes: dict[str, str] = {}
    for name in actions:
        (pod,) = wait_gang_running(clients, namespace, name, "train", 0, nodes=1)
        wait_phase(clients, namespace, name, "Training")
        nodes[name] = pod.spec.node_name
        token = tmp_path / f"{name}-token"
        token.write_text(pod_token(clients, pod))
        ranks[name] = [
            start_freezing_rank(
                local_stacks(rank_env(pod, token, rank, 2), tmp_path / "volume"),
                STEPS,
                STEP_S,
                FREEZE_AT + rank,
                release,
            )
            for rank in (0, 1)
        ]
    try:
        acted = {
            name: wait_for(
                lambda name=name: stall_of(clients, namespace, name),
                until=lambda stall: stall.get("action") is not None,
                timeout=30,
                description=f"{name}: the stall's action",
            )
            for name in actions
        }
        report_job = get_job(clients, namespace, "report")
        assert condition(report_job, "Stalled")["status"] == "True"
        release.write_text("go")  # the gangs move again
        resumed = wait_for(
            lambda: get_job(clients, namespace, "report"),
            until=lambda job: condition(job, "Stalled").get("reason") == "ProgressResumed",
            timeout=20,
            description="report: the condition clears when progress resumes",
        )
        failed = wait_phase(clients, namespace, "fail", "Failed", timeout=20)
        restarted = wait_for(
            lambda: get_job(clients, namespace, "restart"),
            until=lambda job: (job.get("status") or {}).get("attempt") == 1,
            timeout=20,
            description="restart: attempt 1",
        )
        wait_gang_running(clients, namespace, "restart", "train", 1, nodes=1)
    finally:
        release.write_text("go")
        for processes in ranks.values():
            for process in processes:
                try:
                    process.communicate(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate()

    for name, stall in acted.items():
        # Within the bound of the gang's last step (timestamps are whole seconds).
        last = parse_time(stall["lastProgressTime"])
        detected = parse_time(stall["detectedTime"])
        assert last is not None
        assert detected is not None
        assert stall["boundSeconds"] == STALL_TIMEOUT_S
        assert (detected - last).total_seconds() <= STALL_TIMEOUT_S + 1, stall
        assert stall["step"] == FREEZE_AT
        assert [r["rank"] for r in stall["stoppedRanks"]] == [0], stall
        assert stall["stoppedRanks"][0]["node"] == nodes[name]
        stacks = stall["stacks"]
        assert (stacks["state"], stacks["ranksCaptured"]) == ("Captured", 2), stall
        for number in (0, 1):
            text = (
                tmp_path / "volume" / stacks["path"].lstrip("/") / f"rank-{number}.txt"
            ).read_text()
            assert "wait_in_collective" in text  # where the training thread is stuck
            assert "Thread MainThread" in text
        stalled_events = events_with_reason(clients, namespace, name, "Stalled")
        assert len(stalled_events) == 1, stalled_events
        assert stalled_events[0][0] == "Warning"
        assert f"stopped first: rank 0 on {nodes[name]}" in stalled_events[0][2]
        assert stall["action"] == actions[name]

    assert resumed["status"]["stall"]["resolvedTime"]
    assert resumed["status"]["phase"] == "Training"
    assert failed["status"]["reason"] == "StallTimeout"
    assert "stopped first: rank 0" in failed["status"]["message"]
    restarts = restarted["status"]["restarts"]
    assert (restarts["stall"], restarts["total"]) == (1, 1), restarts
    assert restarted["status"]["lastFailure"]["class"] == "Stall"
    assert condition(restarted, "Stalled")["reason"] == "GangRestarted"


def test_a_rank_30_percent_slower_is_named_a_straggler_in_the_status_and_an_event(
    dev_cluster: Any, namespace: str, operator: Any, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    health = {"reportIntervalSeconds": INTERVAL_S}
    pod, token = reporting_job(clients, namespace, "slow", tmp_path, processes=3, health=health)
    ranks = ranks_with_a_straggler(pod, token, 160)
    try:
        named = wait_for(
            lambda: (get_job(clients, namespace, "slow").get("status") or {}).get("stragglers"),
            until=lambda found: bool(found and found.get("ranks")),
            timeout=30,
            description="slow: a straggler named",
        )
    finally:
        for process in ranks:
            outcome(process)
    assert [r["rank"] for r in named["ranks"]] == [2], named
    assert named["ranks"][0]["node"] == pod.spec.node_name
    assert named["ranks"][0]["ratio"] >= 1.2
    warnings = events_with_reason(clients, namespace, "slow", "Straggler")
    assert len(warnings) == 1, warnings
    assert f"rank 2 on {pod.spec.node_name}" in warnings[0][2]


def test_a_persistent_straggler_has_its_node_cordoned_and_the_gang_restarts_on_another_node(
    dev_cluster: Any, namespace: str, operator: Any, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    with testing.extra_nodes(dev_cluster, 2) as added:
        # Pinned to the added nodes: the cordon never touches the session's own.
        affinity = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": added}
                            ]
                        }
                    ]
                }
            }
        }
        health = {
            "reportIntervalSeconds": INTERVAL_S,
            "onStraggler": "Replace",
            "stragglerPersistenceSeconds": 1,
            # The job's own budget has room: the operator's cluster-wide one holds it below.
            "maxStragglerReplacements": 3,
        }
        pod, token = reporting_job(
            clients, namespace, "replace", tmp_path, processes=3, health=health, affinity=affinity
        )
        slow_node = pod.spec.node_name
        ranks = ranks_with_a_straggler(pod, token, 200)
        try:
            restarted = wait_for(
                lambda: get_job(clients, namespace, "replace"),
                until=lambda job: (job.get("status") or {}).get("attempt") == 1,
                timeout=40,
                description="replace: the gang restarted without the straggler's node",
            )
            (new_pod,) = wait_gang_running(clients, namespace, "replace", "train", 1, nodes=1)
        finally:
            for process in ranks:
                process.kill()
                process.communicate()
        node = clients.core.read_node(slow_node)
        assert node.spec.unschedulable
        annotations = node.metadata.annotations
        assert annotations["trainium.dev/cordoned-by"] == f"{namespace}/replace"
        assert "rank 2" in annotations["trainium.dev/cordon-reason"]
        assert new_pod.spec.node_name != slow_node
        status = restarted["status"]
        assert (status["restarts"]["straggler"], status["restarts"]["total"]) == (1, 1)
        (replaced,) = status["stragglers"]["replacements"]
        assert (replaced["rank"], replaced["node"]) == (2, slow_node)
        warnings = events_with_reason(clients, namespace, "replace", "StragglerReplaced")
        assert len(warnings) == 1, warnings
        assert f"rank 2 on {slow_node}" in warnings[0][2]

        # The new gang's rank 2 is slow too, but the operator's cordon budget (1 node) is
        # taken by slow_node: the straggler is only reported, and no other node is cordoned.
        wait_phase(clients, namespace, "replace", "Training")
        token.write_text(pod_token(clients, new_pod))
        ranks = [
            start_rank(rank_env(new_pod, token, rank, 3), 200, 0.065 if rank == 2 else 0.05)
            for rank in range(3)
        ]
        try:
            held = wait_for(
                lambda: (get_job(clients, namespace, "replace").get("status") or {}).get(
                    "stragglers", {}
                ),
                until=lambda record: "cordon budget is spent" in str(record.get("held")),
                timeout=40,
                description="replace: the second straggler held by the cordon budget",
            )
        finally:
            for process in ranks:
                process.kill()
                process.communicate()
        assert f"1 of {CORDON_BUDGET} node(s) cordoned for stragglers ({slow_node})" in held["held"]
        assert not clients.core.read_node(new_pod.spec.node_name).spec.unschedulable
        after = get_job(clients, namespace, "replace")["status"]
        assert (after["attempt"], after["restarts"]["straggler"]) == (1, 1)
        assert any(
            "cordon budget" in e[2]
            for e in events_with_reason(clients, namespace, "replace", "StragglerNotReplaced")
        )

"""The health channel on the dev cluster: ranks are local processes using the public profiler
API with their pod's env, authenticated as their pods by pod-bound tokens the API server issues
(TokenRequest, as the kubelet does for the projected volume); the operator reviews them.

KWOK runs no containers, so each "pod" here is a local process started with the env the
operator gave the pod (as the demo runs its ranks) and a token file written by the test.
"""

from __future__ import annotations

import itertools
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from integration.health_ranks import (
    outcome,
    pod_token,
    rank_env,
    reporting_job,
    start_rank,
    wait_account,
)
from integration.operator_harness import (
    HealthOperator,
    create_job,
    get_job,
    job_manifest,
    kubectl,
    operator_serving,
    wait_gang_running,
    wait_phase,
)
from trainium_operator.contract import channel as contract
from trainium_operator.lifecycle.observed import parse_time

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]


def health_metrics(port: int) -> dict[str, int]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("trainium_operator_health_messages_total{"):
            labels, value = line.rsplit(" ", 1)
            counts[labels.split('"')[1]] = int(value)
    return counts


def test_ranks_report_as_their_pods_and_a_forged_message_from_another_jobs_pod_is_refused(
    clients: Any, namespace: str, tmp_path: Path, health_operator: HealthOperator
) -> None:
    operator, port, metrics = health_operator
    health = {"reportIntervalSeconds": 0.2}
    for name in ("alpha", "beta"):
        create_job(
            clients,
            namespace,
            job_manifest(
                name, nodes=1, processesPerNode=3, compile={"enabled": False}, health=health
            ),
        )
    (alpha,) = wait_gang_running(clients, namespace, "alpha", "train", 0, nodes=1)
    (beta,) = wait_gang_running(clients, namespace, "beta", "train", 0, nodes=1)
    wait_phase(clients, namespace, "alpha", "Training")
    env = {e.name: e.value for e in alpha.spec.containers[0].env}
    assert env[contract.URL] == f"http://127.0.0.1:{port}{contract.PATH}"
    assert any(v.name == contract.TOKEN_VOLUME for v in alpha.spec.volumes)
    wait_account(clients, namespace)

    own, forged, plain = tmp_path / "own", tmp_path / "forged", tmp_path / "plain"
    own.write_text(pod_token(clients, alpha))
    forged.write_text(pod_token(clients, beta))  # beta's pod, claiming to be alpha's rank
    plain.write_text(pod_token(clients, alpha, audience="https://kubernetes.default.svc"))
    ranks = [
        start_rank(rank_env(alpha, own, 0, 3), 15, 0.1),
        start_rank(rank_env(alpha, forged, 1, 3), 15, 0.1),
        start_rank(rank_env(alpha, plain, 2, 3), 15, 0.1),
    ]
    accepted, refused, wrong_audience = (outcome(r) for r in ranks)
    operator.assert_alive()
    counts = health_metrics(metrics)

    assert accepted["sent"] >= 3, accepted
    assert accepted["failures"] == 0, accepted
    assert refused["sent"] == 0
    assert "not a training pod of job alpha" in refused["error"], refused
    assert wrong_audience["sent"] == 0
    assert "not valid" in wrong_audience["error"], wrong_audience
    assert counts["accepted"] >= accepted["sent"]
    assert counts["refused"] >= 2


def stored_ranks(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    (line,) = [x for x in text.splitlines() if x.startswith("trainium_operator_health_stored_")]
    return int(line.rsplit(" ", 1)[1])


def test_the_ranks_of_one_pod_report_as_one_message_sent_by_local_rank_0(
    clients: Any, namespace: str, tmp_path: Path, health_operator: HealthOperator
) -> None:
    operator, _, metrics = health_operator
    pod, token = reporting_job(clients, namespace, "pair", tmp_path, processes=2)
    ranks = [start_rank(rank_env(pod, token, r, 2, local=(r, 2)), 15, 0.1) for r in (0, 1)]
    leader, other = (outcome(r) for r in ranks)
    operator.assert_alive()
    counts, stored = health_metrics(metrics), stored_ranks(metrics)

    assert leader["sent"] >= 3, leader
    assert leader["failures"] == 0, leader
    assert other["sent"] == 0, other  # it never posted: local rank 0 carried its samples
    assert other["written"] >= 3, other
    assert stored == 2  # both ranks, from local rank 0's messages only
    # One accepted message per interval for the pod (+1: the leader's final one after printing).
    assert leader["sent"] <= counts["accepted"] <= leader["sent"] + 1


def test_ranks_keep_training_and_resume_reporting_across_an_operator_restart(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    with operator_serving(dev_cluster, namespace, tmp_path, "--health-port") as (operator, _):
        pod, token = reporting_job(clients, namespace, "gamma", tmp_path)
        steps, step_s = 120, 0.05  # 6 s of training
        started = time.monotonic()
        rank = start_rank(rank_env(pod, token, 0, 1), steps, step_s)
        time.sleep(0.8)
        operator.kill()  # away while the rank trains: its sends fail, its steps do not wait
        time.sleep(0.8)
        operator.start()
        result = outcome(rank)
        elapsed = time.monotonic() - started
    assert result["failures"] >= 1, result  # it did notice the operator away
    assert result["reply"].get("accepted") is True, result  # and reported again after
    # Training took its own time (plus interpreter start), not the operator's absence.
    assert elapsed < steps * step_s + 6, elapsed


def test_steady_progress_shows_step_rate_and_an_eta_within_ten_percent_in_kubectl_get(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    steps, step_s, total = 240, 0.05, 240  # 12 s of training
    with operator_serving(
        dev_cluster, namespace, tmp_path, "--health-port", extra_args=("--progress-interval", "1")
    ):
        health = {"reportIntervalSeconds": 0.25, "totalSteps": total}
        create_job(
            clients,
            namespace,
            job_manifest("delta", processesPerNode=1, compile={"enabled": False}, health=health),
        )
        gang = wait_gang_running(clients, namespace, "delta", "train", 0)
        wait_phase(clients, namespace, "delta", "Training")
        wait_account(clients, namespace)
        ranks = []
        for node_rank, pod in enumerate(gang):
            token = tmp_path / f"token-{node_rank}"
            token.write_text(pod_token(clients, pod))
            ranks.append(start_rank(rank_env(pod, token, node_rank, len(gang)), steps, step_s))
        # After a warm-up window (a full window of step times from every rank):
        deadline = time.monotonic() + 30
        figures: dict[str, Any] = {}
        while time.monotonic() < deadline:
            figures = (get_job(clients, namespace, "delta").get("status") or {}).get(
                "progress"
            ) or {}
            if figures.get("ranksReporting") == 2 and figures.get("step", 0) >= 60:
                break
            time.sleep(0.2)
        read_at = time.time()
        table = kubectl(dev_cluster, namespace, "get", "trainingjobs", "delta")
        results = [outcome(r) for r in ranks]
        ended_at = time.time()
    assert figures.get("step", 0) >= 60, figures
    assert all(r["sent"] > 0 for r in results), results
    header, row = table.stdout.splitlines()[:2]
    assert header.split()[6:9] == ["STEP", "RATE", "ETA"], header
    starts = [header.index(name) for name in ("STEP", "RATE", "ETA", "AGE")]
    step, rate, left_text = (row[a:b].strip() for a, b in itertools.pairwise(starts))
    assert step.endswith(f"/{total}"), row
    assert rate.endswith(" steps/s"), row
    assert left_text.endswith("s"), row  # seconds left
    assert abs(figures["stepTimeP50Ms"] - step_s * 1000) <= 0.1 * step_s * 1000, figures
    assert figures["samplesPerSecond"] > 0
    eta = parse_time(figures["eta"])
    assert eta is not None
    # Against when the ranks really ended: within 10 % of the time that was left, plus the
    # status's one-second timestamp resolution.
    left = ended_at - read_at
    assert abs(eta.timestamp() - ended_at) <= 0.1 * left + 1.0, (figures, read_at, ended_at)

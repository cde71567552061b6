"""Profiling on demand on the dev cluster: `trainium-operator profile now` (and a bad
`kubectl annotate`) on a running job whose ranks are local processes using the public
profiler API as their pods, authenticated by pod-bound tokens (as in test_health_channel.py).

The ranks run with profiling off (spec.profile names only an S3 URI) and no device sources
(KWOK runs no Neuron devices): the request alone opens their capture window, through the health
channel. The captured profile's upload pod is played here as in test_profile_upload.py (its own
command, /data mapped to the local folder standing in for the claim, the local S3 server).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from integration.health_ranks import (
    fast_health_operator,
    local_stacks,
    outcome,
    rank_env,
    ranks_with_a_straggler,
    reporting_job,
    start_rank,
)
from integration.operator_harness import (
    OperatorProcess,
    eventually,
    get_job,
    job_events,
    kubectl,
)
from integration.test_profile_upload import play_upload_pod
from s3_server import S3Bucket
from trainium_devcluster.sim import wait_for
from trainium_operator.builders.upload import LABEL_PROFILE_REQUEST
from trainium_operator.controller.on_demand_commands import profile_now
from trainium_operator.lifecycle.policies.on_demand_profile import ANNOTATION, STATUS_KEY
from trainium_operator.profiler.events import EventKind
from trainium_operator.profiler.format import RankFileReader

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

INTERVAL_S = 0.2
STEPS, STEP_S, CAPTURED_STEPS = 150, 0.03, 10


@pytest.fixture(scope="module")
def shared_operator(
    dev_cluster: Any, crds: None, request: pytest.FixtureRequest, tmp_path_factory: Any
) -> Iterator[OperatorProcess]:
    """This module's operator serves the health channel and wakes jobs every 0.5 s."""
    log_dir = tmp_path_factory.mktemp("on-demand-operator")
    with fast_health_operator(dev_cluster, request.module.__name__, log_dir) as proc:
        yield proc


def annotations(clients: Any, namespace: str, name: str) -> dict[str, str]:
    return dict(get_job(clients, namespace, name)["metadata"].get("annotations") or {})


def steps_in(path: Path) -> list[int]:
    with RankFileReader(path) as reader:
        return sorted(
            int(row[7])
            for block in reader.row_blocks()
            for row in block
            if row[0] == EventKind.STEP
        )


def running_upload_pod(clients: Any, namespace: str, name: str) -> Any:
    def running() -> Any:
        pods = clients.core.list_namespaced_pod(
            namespace, label_selector=f"trainium.dev/job-name={name},{LABEL_PROFILE_REQUEST}"
        ).items
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    return eventually(running, timeout=60, description=f"{name}'s on-demand upload pod Running")


def test_profile_now_makes_every_rank_capture_the_next_n_steps_named_in_the_status(
    dev_cluster: Any, namespace: str, operator: Any, tmp_path: Path, s3: S3Bucket
) -> None:
    clients = dev_cluster.clients
    name = "ondemand"
    pod, token = reporting_job(
        clients,
        namespace,
        name,
        tmp_path,
        processes=2,  # the two local ranks below: the channel binds them to the spec
        health={"reportIntervalSeconds": INTERVAL_S},
        profile={"s3Uri": s3.uri("profiles")},
    )
    volume = tmp_path / "volume"
    ranks: list[subprocess.Popen[str]] = []
    for number in (0, 1):
        env = local_stacks(rank_env(pod, token, number, 2, local=(number, 2)), volume)
        env["TRAINIUM_PROFILE_SOURCES"] = "none"
        ranks.append(start_rank(env, STEPS, STEP_S))
    try:
        # A bad value: one Warning naming the annotation and the fix; the annotation removed.
        kubectl(dev_cluster, namespace, "annotate", "trainingjob", name, f"{ANNOTATION}=20")
        refused = wait_for(
            lambda: [
                e for e in job_events(clients, namespace, name) if e[1] == "ProfileRequestRefused"
            ],
            timeout=20,
            description="the refusal of a bad annotation",
        )
        wait_for(
            lambda: ANNOTATION not in annotations(clients, namespace, name),
            timeout=10,
            description="the bad annotation removed",
        )
        result = CliRunner().invoke(
            profile_now,
            [
                name,
                "-n",
                namespace,
                "--steps",
                str(CAPTURED_STEPS),
                "--kubeconfig",
                str(dev_cluster.kubeconfig),
            ],
        )
        assert result.exit_code == 0, result.output
        record = wait_for(
            lambda: (get_job(clients, namespace, name).get("status") or {}).get(STATUS_KEY) or {},
            until=lambda r: r.get("state") == "Captured",
            timeout=30,
            description="the on-demand profile captured",
        )
        left = annotations(clients, namespace, name)
        results = [outcome(r) for r in ranks]
        played = play_upload_pod(
            clients, namespace, running_upload_pod(clients, namespace, name), volume / "data"
        )
        uploaded = wait_for(
            lambda: (get_job(clients, namespace, name).get("status") or {}).get(STATUS_KEY) or {},
            until=lambda r: (r.get("upload") or {}).get("state") == "Succeeded",
            timeout=30,
            description="the on-demand profile uploaded",
        )
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.communicate()

    # Local rank 0 says "capturing" and "captured" at once, off its interval: a pod's budget
    # (four intervals' worth) takes both, so a legitimate pod is never refused.
    assert all(r["failures"] == 0 and r["error"] == "" for r in results), results
    ((kind, _, message),) = refused
    assert kind == "Warning"
    assert f"{ANNOTATION}='20' is not +N" in message
    assert "set it to +N" in message
    assert ANNOTATION not in left
    assert (record["steps"], record["ranksCaptured"], record["ranksExpected"]) == (
        CAPTURED_STEPS,
        2,
        2,
    )
    assert record["path"].endswith(f"/{namespace}/{name}/0/on-demand/{record['requestId']}")
    directory = volume / record["path"].lstrip("/")
    assert (directory / "profile.json").exists()
    files = sorted(directory.glob("*/rank-*.trnprof"))
    assert [f.name for f in files] == ["rank-0.trnprof", "rank-1.trnprof"]
    for path in files:
        captured = steps_in(path)
        assert len(captured) == CAPTURED_STEPS, captured
        assert captured == list(range(captured[0], captured[0] + CAPTURED_STEPS)), captured
    # Events follow the status write they report.
    events = wait_for(
        lambda: {e[1]: e for e in job_events(clients, namespace, name)},
        until=lambda found: {"ProfileCaptured", "ProfileUploaded"} <= found.keys(),
        timeout=10,
        description="the ProfileCaptured and ProfileUploaded events",
    )
    assert events["ProfileRequested"][0] == "Normal"
    assert events["ProfileCaptured"][0] == "Normal"
    assert record["path"] in events["ProfileCaptured"][2]
    assert played.returncode == 0, played.stderr
    destination = uploaded["upload"]["destination"]
    assert destination == s3.uri(f"profiles/{namespace}/{name}/0/on-demand/{record['requestId']}")
    prefix = destination.removeprefix(f"s3://{s3.bucket}/")
    keys = s3.keys(prefix)
    assert f"{prefix}/profile.json" in keys
    assert sorted(k.rsplit("/", 1)[1] for k in keys if k.endswith(".trnprof")) == [
        "rank-0.trnprof",
        "rank-1.trnprof",
    ]
    assert events["ProfileUploaded"][0] == "Normal"


def test_without_the_operators_cordon_budget_a_replace_job_only_reports_its_straggler(
    dev_cluster: Any, namespace: str, operator: Any, tmp_path: Path
) -> None:
    """This module's operator runs with the defaults: no --straggler-cordon-budget. A job that
    asks for onStraggler: Replace (admitted here: no tenancy policy) gets its straggler named
    and held with the reason, and no node is cordoned: the job author cannot opt the cluster in."""
    clients = dev_cluster.clients
    health = {
        "reportIntervalSeconds": INTERVAL_S,
        "onStraggler": "Replace",
        "stragglerPersistenceSeconds": 1,
    }
    pod, token = reporting_job(clients, namespace, "replace", tmp_path, processes=3, health=health)
    ranks = ranks_with_a_straggler(pod, token, 200)
    try:
        record = wait_for(
            lambda: (get_job(clients, namespace, "replace").get("status") or {}).get(
                "stragglers", {}
            ),
            until=lambda found: bool(found.get("held")),
            timeout=40,
            description="replace: the straggler held",
        )
    finally:
        for process in ranks:
            process.kill()
            process.communicate()
    assert "spec.health.onStraggler: Replace is off in this cluster" in record["held"]
    assert not clients.core.read_node(pod.spec.node_name).spec.unschedulable
    status = get_job(clients, namespace, "replace")["status"]
    assert (status["phase"], status["attempt"]) == ("Training", 0)
    assert not (status.get("restarts") or {}).get("straggler")

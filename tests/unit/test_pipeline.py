"""One pipeline, one write order: every policy runs in `machine.PIPELINE`, a real pass applies
exactly the plan `decide` computes from its snapshot, and for every kind of decision that deletes
or cordons anything the applier stores the status first; a 409 on that write leaves every side
effect undone."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from trainium_operator.builders.upload import upload_pod
from trainium_operator.controller.reconciler import CordonReservations, Reconciler
from trainium_operator.lifecycle import machine
from trainium_operator.lifecycle.decision import Decision
from trainium_operator.lifecycle.policies.on_demand_profile import ANNOTATION
from trainium_operator.lifecycle.policies.profile_upload import UploadDefaults
from trainium_operator.lifecycle.ranks import RankSample
from trainium_operator.lifecycle.render import render_job
from trainium_operator.lifecycle.snapshot import PassSettings
from unit.fake_cluster import FakeCluster, api_error
from unit.jobs import job_document, job_ref
from unit.test_reconciler_writes import (
    KEY,
    NAME,
    NOW,
    admit,
    end_pod,
    new_world,
    ready_node,
    running_gang,
)

ROOT = Path(__file__).resolve().parents[2]
SIDE_EFFECTS = ("create", "delete", "patch", "delete-job")


def test_the_architecture_page_names_the_pipelines_policies_in_order() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text()
    section = page.split("<!-- pipeline -->")[1]
    listed = re.findall(r"^\d+\. \*\*(\w+)\*\*", section, flags=re.M)
    assert listed == [policy.name for policy in machine.PIPELINE]


def test_every_policy_module_is_in_the_pipeline() -> None:
    modules = {
        p.stem
        for p in (ROOT / "operator/trainium_operator/lifecycle/policies").glob("*.py")
        if p.stem != "__init__"
    }
    used = {policy.run.__module__.rsplit(".", 1)[1] for policy in machine.PIPELINE}
    assert modules == used


def test_the_reconciler_calls_no_policy_itself() -> None:
    source = (ROOT / "operator/trainium_operator/controller/reconciler.py").read_text()
    called = [
        policy.name
        for policy in machine.PIPELINE
        if re.search(rf"(?<![.\w]){policy.run.__name__}\(", source)
    ]
    assert called == []
    assert "machine.decide(" in source


# -- a real pass applies exactly the plan its snapshot gives -----------------------------------


def recorded(reconciler: Reconciler) -> tuple[list[Decision], list[Decision]]:
    """(the plans the dry run computes from each pass's snapshot, the plans the passes apply)."""
    dry: list[Decision] = []
    applied: list[Decision] = []
    snapshot, apply = reconciler.snapshot, reconciler._apply

    def snapshot_and_dry_run(body: dict[str, Any]) -> Any:
        taken = snapshot(body)
        dry.append(machine.decide(taken))
        return taken

    def apply_and_record(body: dict[str, Any], current: dict[str, Any], plan: Decision) -> Any:
        applied.append(plan)
        return apply(body, current, plan)

    reconciler.snapshot = snapshot_and_dry_run  # type: ignore[method-assign]
    reconciler._apply = apply_and_record  # type: ignore[method-assign]
    return dry, applied


def frozen_ranks(step: int, since: timedelta) -> Callable[[tuple[str, str]], list[RankSample]]:
    """Three ranks of attempt 0 that entered `step` `since` before NOW and went silent; rank 2
    steps 30 % slower than the others."""

    def ranks(key: tuple[str, str]) -> list[RankSample]:
        return [
            RankSample(
                r,
                0,
                3,
                step,
                ((65.0 if r == 2 else 50.0),) * 16,
                NOW - since,
                node="trn1-1" if r == 2 else "trn1-0",
                step_started=NOW - since,
            )
            for r in range(3)
        ]

    return ranks


@pytest.mark.parametrize("budget", [0, 1], ids=["cordon-budget-spent", "cordon-budget-open"])
def test_a_real_pass_applies_the_plan_the_dry_run_computes_from_a_rich_snapshot(
    budget: int,
) -> None:
    cluster, reconciler = running_gang(
        health={"onStraggler": "Replace", "stragglerPersistenceSeconds": 1, "onStall": "Report"},
        profile={"enabled": True, "s3Uri": "s3://bucket/profiles"},
    )
    for index in range(2, 4):
        cluster.add_node(ready_node(f"trn1-{index}"))
    reconciler.health_url = "http://operator:8443"
    reconciler.progress = frozen_ranks(120, timedelta(minutes=10))  # a stall in progress
    reconciler.cordons = CordonReservations(budget)
    reconciler.pass_settings = PassSettings(UploadDefaults(s3_uri="s3://chart/default"), 10.0)
    # An on-demand profile request, and an upload pod of an earlier attempt.
    cluster.update("TrainingJob", NAME, {"metadata": {"annotations": {ANNOTATION: "+5"}}})
    job = job_ref(profile={"enabled": True, "s3Uri": "s3://bucket/profiles"})
    old_upload = upload_pod(job, 0, "s3://bucket/profiles", UploadDefaults().pod_settings())
    old_upload["metadata"]["ownerReferences"][0]["uid"] = job.uid
    cluster.create(old_upload)
    dry, applied = recorded(reconciler)
    for _ in range(3):
        reconciler.reconcile(*KEY)
    assert applied, "no pass applied a plan"
    assert dry == applied
    assert any(plan.events for plan in applied), "the snapshot was not rich enough to decide"


def test_the_dry_run_renders_the_objects_a_real_pass_creates_for_a_new_job() -> None:
    cluster, reconciler = new_world()
    reconciler.reconcile(*KEY)
    admit(cluster, "bert-train")
    reconciler.reconcile(*KEY)
    created = [w.name for w in cluster.of("create")]
    rendered = render_job(job_document(compile={"enabled": False}), NOW)
    assert [o["metadata"]["name"] for o in rendered] == created


# -- the write order, per kind of decision ---------------------------------------------------


def finish(cluster: FakeCluster, reconciler: Reconciler) -> None:
    for pod in ("bert-train-0-0", "bert-train-0-1"):
        end_pod(cluster, pod, exit_code=0)


def fail(cluster: FakeCluster, reconciler: Reconciler) -> None:
    end_pod(cluster, "bert-train-0-0", exit_code=1)


def suspend(cluster: FakeCluster, reconciler: Reconciler) -> None:
    cluster.update("TrainingJob", NAME, {"spec": {"runPolicy": {"suspend": True}}})


def stall(cluster: FakeCluster, reconciler: Reconciler) -> None:
    reconciler.health_url = "http://operator:8443"
    reconciler.progress = frozen_ranks(120, timedelta(hours=1))


def straggler(cluster: FakeCluster, reconciler: Reconciler) -> None:
    for index in range(2, 4):
        cluster.add_node(ready_node(f"trn1-{index}"))
    reconciler.health_url = "http://operator:8443"
    reconciler.cordons = CordonReservations(1)
    steps = {"n": 100}

    def ranks(key: tuple[str, str]) -> list[RankSample]:
        steps["n"] += 20
        return [
            RankSample(
                r,
                0,
                3,
                steps["n"],
                ((65.0 if r == 2 else 50.0),) * 16,
                reconciler.clock(),
                node="trn1-1" if r == 2 else "trn1-0",
            )
            for r in range(3)
        ]

    reconciler.progress = ranks


DECISIONS: dict[str, tuple[dict[str, Any], Callable[[FakeCluster, Reconciler], None]]] = {
    "finish": ({"runPolicy": {"cleanPodPolicy": "All"}}, finish),
    "fail": ({"runPolicy": {"backoffLimit": 0}}, fail),
    "restart": ({"runPolicy": {"backoffLimit": 3}}, fail),
    "suspend": ({}, suspend),
    "ttl": ({"runPolicy": {"cleanPodPolicy": "All", "ttlSecondsAfterFinished": 0}}, finish),
    "stall": (
        {"health": {"onStall": "Restart", "stallTimeoutSeconds": 60, "reportIntervalSeconds": 1}},
        stall,
    ),
    "straggler": (
        {"health": {"onStraggler": "Replace", "stragglerPersistenceSeconds": 1}},
        straggler,
    ),
}


def until_side_effects(cluster: FakeCluster, reconciler: Reconciler) -> Decision:
    """Passes (the clock 20 s further each) until the next pass's plan deletes or cordons
    anything; that plan, not applied yet."""
    clock = {"now": NOW}
    reconciler.clock = lambda: clock["now"]
    for _ in range(30):
        body = reconciler.cache.job(KEY)
        assert body is not None
        plan = machine.decide(reconciler.snapshot(body))
        if plan.delete_pods or plan.patch_nodes or plan.delete_job or plan.delete_podgroups:
            return plan
        reconciler.reconcile(*KEY)
        clock["now"] += timedelta(seconds=20)
    raise AssertionError("no pass decided a deletion")


@pytest.mark.parametrize("kind", list(DECISIONS))
def test_a_decision_that_deletes_stores_its_status_first_and_a_409_leaves_everything_undone(
    kind: str,
) -> None:
    spec, make_it_happen = DECISIONS[kind]
    cluster, reconciler = running_gang(**spec)
    make_it_happen(cluster, reconciler)
    plan = until_side_effects(cluster, reconciler)
    cluster.writes.clear()
    cluster.events.clear()
    cluster.refuse("status", "TrainingJob", api_error(409, "the object has been modified"))
    with pytest.raises(ApiException):
        reconciler.reconcile(*KEY)
    assert [w for w in cluster.writes if w.verb in SIDE_EFFECTS] == [], (
        f"{kind}: side effects of a plan whose status was not stored"
    )
    assert not cluster.events, f"{kind}: an event for a status that was not stored"
    cluster.allow("status", "TrainingJob")
    reconciler.reconcile(*KEY)
    verbs = [w.verb for w in cluster.writes]
    assert verbs[0] == "status", f"{kind}: {verbs}"
    assert set(verbs[1:]) & set(SIDE_EFFECTS), f"{kind}: the plan's side effects did not follow"
    if plan.patch_nodes:
        assert verbs.index("patch") < verbs.index("delete"), "the cordon before the deletes"

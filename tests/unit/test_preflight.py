"""The gang preflight: its node reports and judging rule (contract/preflight.py), the pods'
command and node exclusion (builders/pods.py), and the verdict policy driven through the whole
pipeline (lifecycle/policies/preflight.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest

from trainium_operator.builders import pods as pod_builders
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.contract import preflight as contract
from trainium_operator.lifecycle.observed import PodView
from trainium_operator.lifecycle.policies.stragglers import CordonBudget
from trainium_operator.lifecycle.snapshot import PassSettings
from unit.jobs import decide, job_ref
from unit.test_lifecycle import T0, gang, names, observed, pod


def report(
    *,
    device: float | None = 10.0,
    network: float | None = 2.0,
    outcome: str = contract.UNFIT,
    found: int = 16,
    healthy: bool = True,
    seconds: float = 6.0,
) -> contract.NodeReport:
    return contract.NodeReport(
        outcome=outcome,
        seconds=seconds,
        devices_expected=16,
        devices_found=found,
        devices_healthy=healthy,
        device_gbps=device,
        network_gbps=network,
        gang_gbps=1.5,
    )


# -- the report and the rule ------------------------------------------------------------------
def test_a_report_round_trips_through_its_termination_message() -> None:
    written = report(device=12.5, network=None)
    assert contract.parse_report(written.to_json()) == written
    assert len(written.to_json()) < contract.MAX_REPORT_BYTES


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (None, "no report"),
        ("x" * 2000, "larger than"),
        ("{not json", "not JSON"),
        ('{"kind": "other"}', "not a trainium.dev/preflight report"),
        ("[1, 2]", "not a trainium.dev/preflight report"),
        ("[" * 900 + "]" * 100, "not JSON"),
    ],
)
def test_a_message_that_is_not_a_report_is_refused_with_its_reason(
    raw: str | None, says: str
) -> None:
    with pytest.raises(ValueError, match=says):
        contract.parse_report(raw)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("outcome", "great", "outcome"),
        ("deviceGBps", float("inf"), "deviceGBps"),
        ("deviceGBps", -1, "deviceGBps"),
        ("networkGBps", "fast", "networkGBps"),
        ("networkGBps", True, "networkGBps"),
        ("devicesFound", 10**9, "devicesFound"),
        ("devicesHealthy", "yes", "devicesHealthy"),
        ("seconds", 1e12, "seconds"),
        ("version", 2, "version"),
    ],
)
def test_a_hostile_report_field_is_refused_naming_the_field(
    field: str, value: Any, says: str
) -> None:
    body = json.loads(report().to_json())
    body[field] = value
    with pytest.raises(ValueError, match=says):
        contract.parse_report(json.dumps(body))


def test_a_node_below_the_other_nodes_median_by_more_than_the_threshold_is_unfit() -> None:
    reports = {
        "n0": report(network=2.0),
        "n1": report(network=2.1),
        "n2": report(network=0.9),
        "n3": report(network=1.9),
    }
    [verdict] = contract.judge(reports, 0.25)
    assert (verdict.node, verdict.reason) == ("n2", contract.REASON_NETWORK)
    assert verdict.ratio == pytest.approx(0.9 / 2.0, abs=1e-3)
    assert "0.9 GB/s" in verdict.detail


def test_in_a_two_node_gang_only_the_slow_node_is_unfit() -> None:
    # Each node is held to the *other* node's figure: the fast one is never the outlier.
    verdicts = contract.judge({"a": report(device=10.0), "b": report(device=3.0)}, 0.25)
    assert [(v.node, v.reason) for v in verdicts] == [("b", contract.REASON_DEVICE_THROUGHPUT)]


def test_missing_or_unusable_devices_make_a_node_unfit_before_any_figure() -> None:
    verdicts = contract.judge(
        {
            "a": report(found=15, network=0.1),
            "b": report(healthy=False),
            "c": report(),
        },
        0.25,
    )
    assert [(v.node, v.reason) for v in verdicts] == [
        ("a", contract.REASON_DEVICES),
        ("b", contract.REASON_DEVICES),
    ]
    assert verdicts[0].detail == "15 of 16 devices found"


def test_figures_within_the_threshold_and_a_lone_report_find_nothing() -> None:
    within = {"a": report(network=2.0), "b": report(network=1.6), "c": report(network=2.2)}
    assert contract.judge(within, 0.25) == []
    assert contract.judge({"a": report(network=0.001)}, 0.25) == []


# -- the pods --------------------------------------------------------------------------------
def preflighted_pod(job: JobRef, **kw: Any) -> dict[str, Any]:
    return pod_builders.pod(job, Stage.TRAIN, 2, 0, preflighted=True, **kw)


def test_a_preflighted_pod_runs_the_check_through_the_stages_rendezvous_then_its_command() -> None:
    job = job_ref(compile={"enabled": False}, preflight={"enabled": True, "timeoutSeconds": 120})
    command = preflighted_pod(job)["spec"]["containers"][0]["command"]
    split = command.index(contract.COMMAND_SEPARATOR)
    check, stage = command[:split], command[split + 1 :]
    assert check[:3] == ["python3", "-m", contract.MODULE]
    assert "--nnodes=2" in check
    assert "--timeout=120" in check
    assert "--expected-devices=16" in check  # trn1.32xlarge: 16 Trainium chips
    assert f"--report={contract.TERMINATION_MESSAGE_PATH}" in check
    endpoint = next(a for a in stage if a.startswith("--rdzv_endpoint=")).split("=", 1)[1]
    host, port = endpoint.rsplit(":", 1)
    # The same rank-0 host, on the port beside the stage's: its store never meets the stage's.
    assert f"--rdzv-endpoint={host}:{int(port) + 1}" in check
    run_id = next(a for a in stage if a.startswith("--rdzv_id=")).split("=", 1)[1]
    assert f"--rdzv-id={run_id}-preflight" in check  # its own run, never the stage's
    assert stage == pod_builders.container_command(job, Stage.TRAIN, 2)


def test_excluded_nodes_are_added_to_every_term_of_the_jobs_own_node_affinity() -> None:
    own_terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": own_terms}
        }
    }
    job = job_ref(affinity=affinity)
    terms = preflighted_pod(job, excluded_nodes=["n2", "n5"])["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    excluded = {"key": "metadata.name", "operator": "NotIn", "values": ["n2", "n5"]}
    assert [t["matchFields"] for t in terms] == [[excluded], [excluded]]
    assert [t["matchExpressions"] for t in terms] == [t["matchExpressions"] for t in own_terms]
    assert job.spec.affinity == affinity  # the spec is not changed
    plain = preflighted_pod(job_ref(), excluded_nodes=["n2"])["spec"]["affinity"]
    assert plain["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}
        ]
    }


def test_the_operators_default_preflights_multi_node_jobs_only_and_a_jobs_own_choice_wins() -> None:
    assert job_ref(nodes=2).spec.preflight_on(True)
    assert not job_ref(nodes=1).spec.preflight_on(True)
    assert not job_ref(nodes=2).spec.preflight_on(False)
    assert job_ref(nodes=1, preflight={"enabled": True}).spec.preflight_on(False)
    assert not job_ref(nodes=4, preflight={"enabled": False}).spec.preflight_on(True)


# -- the verdict -----------------------------------------------------------------------------
def ended(job: JobRef, rank: int, node: str, message: str | None, code: int = 86) -> PodView:
    return pod(
        job,
        Stage.TRAIN,
        0,
        rank,
        "Failed",
        exit_code=code,
        reason="Error",
        node=node,
        termination_message=message,
        finished_at=T0,
    )


def preflight_job(**spec: Any) -> JobRef:
    return job_ref(
        **{"compile": {"enabled": False}, "nodes": 3, "preflight": {"enabled": True}, **spec}
    )


def training(job: JobRef) -> dict[str, Any]:
    return decide(job, {}, observed(*gang(job, Stage.TRAIN, 0))).status


def test_an_unfit_node_is_named_excluded_and_the_gang_restarts_without_it() -> None:
    job = preflight_job()
    slow = report(network=0.5).to_json()
    ok = report(network=2.0, seconds=7.5).to_json()
    gang_ended = [ended(job, 0, "n0", ok), ended(job, 1, "n1", slow), ended(job, 2, "n2", ok)]
    decision = decide(job, training(job), observed(*gang_ended))
    status = decision.status
    assert status["phase"] == "Restarting"
    assert status["restarts"]["preflight"] == 1
    assert status["restarts"].get("application", 0) == 0  # not charged to backoffLimit
    record = status["preflight"]
    assert record["outcome"] == "Unfit"
    assert record["excludedNodes"] == ["n1"]
    assert record["seconds"] == 7.5
    assert record["reports"] == 3
    assert [(n["node"], n["reason"]) for n in record["unfit"]] == [("n1", "NetworkBandwidth")]
    assert status["lastFailure"]["class"] == "Preflight"
    assert status["lastFailure"]["node"] == "n1"
    warnings = [e for e in decision.events if e.reason == "PreflightNodeExcluded"]
    assert len(warnings) == 1
    assert "n1" in warnings[0].message
    # The next gang's pods avoid n1.
    started = decide(job, status, observed(*gang_ended))
    assert names(started.create) == [f"bert-train-1-{r}" for r in range(3)]
    for created in started.create:
        terms = created["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert terms == [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}
        ]


def test_a_report_is_its_pods_node_only_and_its_text_is_never_echoed() -> None:
    job = preflight_job()
    # A report with extra keys naming another node, and one pod whose message is not a report.
    body = json.loads(report(network=2.0).to_json())
    body["node"] = "n2"
    body["note"] = "<script>ignore previous instructions</script>"
    lying = json.dumps(body)
    gang_ended = [
        ended(job, 0, "n0", lying),
        ended(job, 1, "n1", report(network=2.1).to_json()),
        ended(job, 2, "n2", "<script>x</script>"),
    ]
    decision = decide(job, training(job), observed(*gang_ended))
    record = decision.status["preflight"]
    assert record["outcome"] == "Failed"  # no node below the bound by the reports read
    assert record["reports"] == 2
    assert record["excludedNodes"] == []
    text = json.dumps(decision.status) + " ".join(e.message for e in decision.events)
    assert "script" not in text
    assert "ignore previous" not in text


def test_the_verdict_waits_for_the_other_pods_to_end_within_a_bound() -> None:
    job = preflight_job()
    slow = ended(job, 1, "n1", report(network=0.5).to_json())
    status = training(job)
    running = [pod(job, Stage.TRAIN, 0, 0), slow, pod(job, Stage.TRAIN, 0, 2)]
    waiting = decide(job, status, observed(*running, now=T0 + timedelta(seconds=5)))
    assert waiting.status["phase"] == "Training"  # neither a restart nor an application failure
    assert "preflight" not in waiting.status
    assert waiting.requeue_after == pytest.approx(25.0)
    late = decide(job, status, observed(*running, now=T0 + timedelta(seconds=31)))
    assert late.status["phase"] == "Restarting"
    assert late.status["preflight"]["reports"] == 1  # judged on what ended; nothing unfit alone
    assert late.status["preflight"]["outcome"] == "Failed"


def test_a_timed_out_preflight_restarts_without_excluding_anyone() -> None:
    job = preflight_job()
    timed_out = report(outcome=contract.TIMEOUT, device=None, network=None).to_json()
    gang_ended = [ended(job, r, f"n{r}", timed_out, code=87) for r in range(3)]
    decision = decide(job, training(job), observed(*gang_ended))
    assert decision.status["preflight"]["outcome"] == "TimedOut"
    assert decision.status["preflight"]["excludedNodes"] == []
    assert decision.status["lastFailure"]["reason"] == "PreflightTimedOut"


def test_past_max_retries_the_job_fails_with_preflight_failed_naming_the_node() -> None:
    job = preflight_job(preflight={"enabled": True, "maxRetries": 1})
    status = {
        **training(job),
        "restarts": {"total": 1, "preflight": 1},
        "preflight": {"attempt": 0, "outcome": "Unfit", "excludedNodes": ["n3"]},
    }
    slow = report(network=0.5).to_json()
    ok = report().to_json()
    gang_ended = [ended(job, 0, "n0", ok), ended(job, 1, "n1", slow), ended(job, 2, "n2", ok)]
    decision = decide(job, status, observed(*gang_ended))
    assert decision.status["phase"] == "Failed"
    assert decision.status["reason"] == "PreflightFailed"
    assert "n1" in decision.status["message"]
    assert "maxRetries (1) exhausted" in decision.status["message"]
    assert decision.status["preflight"]["excludedNodes"] == ["n3", "n1"]


def test_a_compile_gang_that_fails_its_preflight_restarts_instead_of_failing_the_job() -> None:
    job = job_ref(nodes=2, preflight={"enabled": True})
    status = decide(job, {}, observed(*gang(job, Stage.COMPILE, 0))).status
    slow, ok = report(device=1.0).to_json(), report(device=10.0).to_json()
    gang_ended = [
        pod(job, Stage.COMPILE, 0, r, "Failed", exit_code=86, node=f"n{r}",
            termination_message=m, finished_at=T0)
        for r, m in ((0, ok), (1, slow))
    ]  # fmt: skip
    decision = decide(job, status, observed(*gang_ended))
    assert decision.status["phase"] == "Restarting"
    assert decision.status["preflight"]["stage"] == "compile"
    assert decision.status["preflight"]["excludedNodes"] == ["n1"]


def test_without_the_preflight_the_same_exit_code_is_an_ordinary_application_failure() -> None:
    job = job_ref(compile={"enabled": False}, nodes=3)
    gang_ended = [ended(job, r, f"n{r}", report().to_json()) for r in range(3)]
    decision = decide(job, training(job), observed(*gang_ended))
    assert decision.status["restarts"]["application"] == 1
    assert "preflight" not in decision.status


def test_the_operators_multi_node_default_preflights_a_job_that_does_not_say() -> None:
    job = job_ref(compile={"enabled": False}, nodes=2)
    on = PassSettings(preflight_multi_node=True)
    created = decide(job, {}, observed(), settings=on).create
    commands = [o["spec"]["containers"][0]["command"] for o in created if o["kind"] == "Pod"]
    assert commands
    assert all(c[:3] == ["python3", "-m", contract.MODULE] for c in commands)


def slow_second_node(job: JobRef) -> list[PodView]:
    slow, ok = report(network=0.5).to_json(), report().to_json()
    return [ended(job, 0, "n0", ok), ended(job, 1, "n1", slow), ended(job, 2, "n2", ok)]


def test_on_unfit_cordon_cordons_the_node_within_the_operators_budget() -> None:
    job = preflight_job(preflight={"enabled": True, "onUnfit": "Cordon"})
    decision = decide(
        job, training(job), observed(*slow_second_node(job)), cordon_budget=CordonBudget(2)
    )
    [patch] = decision.patch_nodes
    assert patch.name == "n1"
    assert patch.body["spec"] == {"unschedulable": True}
    assert patch.body["metadata"]["labels"] == {"trainium.dev/cordoned": "preflight"}
    assert decision.status["preflight"]["cordoned"] == ["n1"]
    assert decision.status["phase"] == "Restarting"
    assert decision.status_first  # the verdict is stored before the cordon and the deletes


@pytest.mark.parametrize(
    ("budget", "says"),
    [
        (CordonBudget(0), "cordons no nodes"),
        (CordonBudget(1, frozenset({"n9"})), "cordon budget is spent"),
    ],
)
def test_without_room_in_the_cordon_budget_an_unfit_node_is_only_excluded(
    budget: CordonBudget, says: str
) -> None:
    job = preflight_job(preflight={"enabled": True, "onUnfit": "Cordon"})
    decision = decide(job, training(job), observed(*slow_second_node(job)), cordon_budget=budget)
    assert decision.patch_nodes == []
    record = decision.status["preflight"]
    assert record["excludedNodes"] == ["n1"]
    assert says in record["held"]
    assert [e.reason for e in decision.events if e.reason == "PreflightNodeNotCordoned"] == [
        "PreflightNodeNotCordoned"
    ]


def test_the_default_exclude_never_cordons_even_with_a_budget() -> None:
    job = preflight_job()
    decision = decide(
        job, training(job), observed(*slow_second_node(job)), cordon_budget=CordonBudget(5)
    )
    assert decision.patch_nodes == []
    assert "held" not in decision.status["preflight"]


def test_a_passed_check_is_recorded_once_its_gang_ends_and_its_time_leaves_training() -> None:
    job = preflight_job()
    status = training(job)
    passed = report(outcome=contract.PASSED, seconds=9.0).to_json()
    done = [
        pod(job, Stage.TRAIN, 0, r, "Succeeded", exit_code=0, node=f"n{r}",
            termination_message=passed, finished_at=T0)
        for r in range(3)
    ]  # fmt: skip
    later = observed(*done, now=T0 + timedelta(seconds=100))
    decision = decide(job, status, later)
    assert decision.status["phase"] == "Succeeded"
    assert decision.status["preflight"]["passed"] == {
        "attempt": 0,
        "stage": "train",
        "seconds": 9.0,
    }
    goodput = decision.status["goodput"]
    assert goodput["preflightSeconds"] == 9.0
    assert goodput["trainingSeconds"] == 91.0


def test_a_gang_whose_messages_are_not_reports_records_no_passed_check() -> None:
    job = preflight_job()
    done = [
        pod(job, Stage.TRAIN, 0, r, "Succeeded", exit_code=0, node=f"n{r}",
            termination_message='{"kind": "trainium.dev/neff-cache-summary"}')
        for r in range(3)
    ]  # fmt: skip
    decision = decide(job, training(job), observed(*done))
    assert "preflight" not in decision.status

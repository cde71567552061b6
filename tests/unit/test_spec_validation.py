from __future__ import annotations

import pytest

from trainium_operator.builders.job import JobRef
from trainium_operator.controller.reconciler import parse_job
from unit.jobs import job_document


def problems_of(**spec: object) -> list[str]:
    parsed = parse_job(job_document(**spec))
    assert not isinstance(parsed, JobRef), "expected the spec to be refused"
    return parsed


def test_processes_per_node_defaults_from_the_instance_type() -> None:
    for instance_type, expected in [
        ("trn1.32xlarge", 32),
        ("trn1n.32xlarge", 32),
        ("trn1.2xlarge", 2),
        ("trn2.48xlarge", 64),
        ("trn2u.48xlarge", 64),
    ]:
        parsed = parse_job(job_document(instanceType=instance_type))
        assert isinstance(parsed, JobRef)
        assert parsed.spec.effective_processes_per_node == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"nodes": 0}, "spec.nodes: Input should be greater than or equal to 1", id="nodes"
        ),
        pytest.param(
            {"instanceType": "p4d.24xlarge"}, "spec.instanceType: Input should be", id="type"
        ),
        pytest.param({"processesPerNode": 64}, "spec.processesPerNode cannot exceed", id="procs"),
        pytest.param(
            {"rendezvous": {"backend": "etcd"}}, "spec.rendezvous.endpoint is required", id="etcd"
        ),
        pytest.param(
            {"env": [{"name": "WORLD_SIZE", "value": "4"}]}, "(got WORLD_SIZE)", id="reserved-env"
        ),
        pytest.param({"env": [{"name": "PET_NNODES", "value": "4"}]}, "(got PET_NNODES)", id="pet"),
        pytest.param(
            {"profile": {"startStep": 5, "endStep": 1}}, "spec.profile.endStep must be", id="steps"
        ),
        pytest.param(
            {"compile": {"cacheSet": "a/b"}},
            "spec.compile.cacheSet: String should match",
            id="cacheset",
        ),
        pytest.param({"replicas": 2}, "spec.replicas: Extra inputs are not permitted", id="typo"),
        pytest.param(
            {"scheduling": {"queue": "Team_A"}}, "spec.scheduling.queue: String should", id="queue"
        ),
        pytest.param(
            {"storage": {"claimName": "fsx claim"}}, "spec.storage.claimName: String", id="claim"
        ),
        pytest.param(
            {"scheduling": {"priorityClassName": "High!"}},
            "spec.scheduling.priorityClassName: String should match",
            id="priority-class",
        ),
        pytest.param(
            {"serviceAccountName": "x" * 254}, "spec.serviceAccountName: String", id="account"
        ),
        pytest.param(
            {"runPolicy": {"cleanPodPolicy": "Some"}}, "spec.runPolicy.cleanPodPolicy", id="policy"
        ),
    ],
)
def test_invalid_specs_are_refused_naming_the_field(spec: dict[str, object], expected: str) -> None:
    problems = problems_of(**spec)
    assert any(expected in p for p in problems), problems


def test_every_problem_is_reported_at_once() -> None:
    problems = problems_of(nodes=0, instanceType="x", image="")
    assert len(problems) == 3, problems


def test_user_env_may_override_operator_defaults_but_not_torchrun_names() -> None:
    parsed = parse_job(job_document(env=[{"name": "CCOM_SOCKET_IFNAME", "value": "ens5"}]))
    assert isinstance(parsed, JobRef)


def test_trn2_logical_core_config_sets_the_worker_count() -> None:
    parsed = parse_job(job_document(instanceType="trn2.48xlarge", lnc=1))
    assert isinstance(parsed, JobRef)
    assert parsed.spec.effective_processes_per_node == 128
    assert parsed.spec.effective_lnc == 1
    trn1 = parse_job(job_document(instanceType="trn1.32xlarge"))
    assert isinstance(trn1, JobRef)
    assert trn1.spec.effective_lnc is None


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {"instanceType": "trn1.32xlarge", "lnc": 2},
            "spec.lnc (the logical NeuronCore config) applies only to Trainium2",
            id="lnc-on-trn1",
        ),
        pytest.param(
            {"instanceType": "trn2.48xlarge", "processesPerNode": 128},
            "spec.processesPerNode cannot exceed the (logical) NeuronCores",
            id="procs-over-64-at-lnc-2",
        ),
        pytest.param(
            {"instanceType": "trn2.48xlarge", "lnc": 3},
            "spec.lnc: Input should be less than or equal to 2",
            id="lnc-3",
        ),
    ],
)
def test_trn2_settings_are_refused_naming_the_field(spec: dict[str, object], expected: str) -> None:
    assert any(expected in problem for problem in problems_of(**spec)), problems_of(**spec)


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"spec": {"containers": [{"name": "trainer", "volumeMounts": 5}]}}, "volumeMounts"),
        ({"spec": {"containers": [{"name": "trainer", "volumeMounts": ["a"]}]}}, "volumeMounts"),
        ({"spec": {"containers": 5}}, "spec.podTemplate.spec.containers"),
        ({"spec": {"volumes": [1, 2]}}, "spec.podTemplate.spec.volumes"),
        ({"metadata": {"labels": 5}}, "spec.podTemplate.metadata.labels"),
    ],
)
def test_pass_through_content_of_the_wrong_shape_is_a_problem_naming_it_not_a_crash(
    template: dict[str, object], field: str
) -> None:
    problems = parse_job(job_document(podTemplate=template))
    assert isinstance(problems, list), "accepted"
    assert any(field in problem for problem in problems), problems

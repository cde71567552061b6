from __future__ import annotations

import pytest

from trainium_operator.builders.job import JobRef
from trainium_operator.lifecycle.parse import parse_job
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


SUBDOMAIN_FIX = "(lower-case alphanumerics, '-' or '.', starting and ending with an alphanumeric, "
LABEL_FIX = "(lower-case alphanumerics or '-', starting and ending with an alphanumeric, at most 63"
SIDECAR = {"name": "sidecar", "image": "example.com/sidecar:1"}


def _sidecar(**fields: object) -> dict[str, object]:
    return {"spec": {"containers": [{**SIDECAR, **fields}]}}


def _volume(**source: object) -> dict[str, object]:
    return {"spec": {"volumes": [{"name": "v", **source}]}}


TOKEN_A_B = {"name": "tok", "key": "a/b"}


def _env_from(**source: object) -> list[dict[str, object]]:
    return [{"name": "T", "valueFrom": source}]


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        pytest.param(
            {"spec": {"imagePullSecrets": [{"name": "ECR_Secret"}]}},
            'spec.podTemplate.spec.imagePullSecrets[0].name: "ECR_Secret" is not a valid Secret '
            f"name {SUBDOMAIN_FIX}at most 253 characters)",
            id="image-pull-secret",
        ),
        pytest.param(
            _volume(secret={"secretName": "Bad_Name"}),
            'spec.podTemplate.spec.volumes[0].secret.secretName: "Bad_Name" is not a valid Secret '
            f"name {SUBDOMAIN_FIX}",
            id="volume-secret",
        ),
        pytest.param(
            _volume(configMap={"name": "my config"}),
            'spec.podTemplate.spec.volumes[0].configMap.name: "my config" is not a valid '
            "ConfigMap name",
            id="volume-config-map",
        ),
        pytest.param(
            _volume(persistentVolumeClaim={"claimName": "x" * 254}),
            "spec.podTemplate.spec.volumes[0].persistentVolumeClaim.claimName: "
            f'"{"x" * 254}" is not a valid PersistentVolumeClaim name',
            id="volume-claim",
        ),
        pytest.param(
            _volume(
                projected={"sources": [{"secret": {"name": "ok"}}, {"configMap": {"name": "-b"}}]}
            ),
            'spec.podTemplate.spec.volumes[0].projected.sources[1].configMap.name: "-b" is not '
            "a valid ConfigMap name",
            id="projected-config-map",
        ),
        pytest.param(
            _volume(projected={"sources": [{"secret": {"name": "Upper"}}]}),
            'spec.podTemplate.spec.volumes[0].projected.sources[0].secret.name: "Upper" is not a '
            "valid Secret name",
            id="projected-secret",
        ),
        pytest.param(
            {"spec": {"volumes": [{"name": "Data", "emptyDir": {}}]}},
            f'spec.podTemplate.spec.volumes[0].name: "Data" is not a valid volume name {LABEL_FIX}',
            id="volume-name",
        ),
        pytest.param(
            {"spec": {"volumes": [{"name": "a.b", "emptyDir": {}}]}},
            'spec.podTemplate.spec.volumes[0].name: "a.b" is not a valid volume name',
            id="volume-name-is-a-label-not-a-subdomain",
        ),
        pytest.param(
            {"spec": {"containers": [{"name": "trainer", "volumeMounts": [{"name": "x" * 64}]}]}},
            f'spec.podTemplate.spec.containers[0].volumeMounts[0].name: "{"x" * 64}" is not a '
            "valid volume name",
            id="volume-mount-name",
        ),
        pytest.param(
            _sidecar(name="Side_Car"),
            'spec.podTemplate.spec.containers[0].name: "Side_Car" is not a valid container name',
            id="container-name",
        ),
        pytest.param(
            _sidecar(envFrom=[{"secretRef": {"name": "db_creds"}}]),
            'spec.podTemplate.spec.containers[0].envFrom[0].secretRef.name: "db_creds" is not a '
            "valid Secret name",
            id="env-from-secret",
        ),
        pytest.param(
            _sidecar(envFrom=[{"prefix": "X_", "configMapRef": {"name": "Settings"}}]),
            'spec.podTemplate.spec.containers[0].envFrom[0].configMapRef.name: "Settings" is not '
            "a valid ConfigMap name",
            id="env-from-config-map",
        ),
        pytest.param(
            {"spec": {"initContainers": [{**SIDECAR, "env": _env_from(secretKeyRef=TOKEN_A_B)}]}},
            'spec.podTemplate.spec.initContainers[0].env[0].valueFrom.secretKeyRef.key: "a/b" is '
            "not a valid Secret key (alphanumerics, '-', '_' or '.', at most 253 characters, "
            "neither '.' nor starting with '..')",
            id="init-env-secret-key",
        ),
        pytest.param(
            _sidecar(env=_env_from(configMapKeyRef={"name": "C", "key": "k"})),
            'spec.podTemplate.spec.containers[0].env[0].valueFrom.configMapKeyRef.name: "C" is '
            "not a valid ConfigMap name",
            id="env-config-map",
        ),
        pytest.param(
            _sidecar(env=_env_from(configMapKeyRef={"name": "c", "key": ".."})),
            'configMapKeyRef.key: ".." is not a valid ConfigMap key',
            id="env-config-map-key-dot-dot",
        ),
    ],
)
def test_a_name_inside_the_pod_template_that_no_object_can_have_is_refused_naming_field_and_rule(
    template: dict[str, object], expected: str
) -> None:
    problems = problems_of(podTemplate=template)
    assert any(expected in p for p in problems), problems


def test_a_top_level_env_value_from_names_a_valid_secret_and_key() -> None:
    problems = problems_of(env=_env_from(secretKeyRef={"name": "hf.Token", "key": "t"}))
    assert any(
        p.startswith('spec.env[0].valueFrom.secretKeyRef.name: "hf.Token" is not a valid Secret')
        for p in problems
    ), problems


def test_every_name_in_the_pod_template_set_correctly_is_accepted() -> None:
    subdomain = ".".join(["a" * 63] * 4)[:253].rstrip(".")
    env_from = [{"secretRef": {"name": subdomain}}, {"configMapRef": {"name": "cfg.v1"}}]
    env = [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s-1", "key": ".dot_file-1.X"}}},
        {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k" * 253}}},
        {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    template = {
        "spec": {
            "imagePullSecrets": [{"name": "ecr.registry-1"}],
            "volumes": [
                {"name": "x" * 63, "secret": {"secretName": "s.a-b", "defaultMode": 0o400}},
                {"name": "conf", "configMap": {"name": "c0"}},
                {"name": "more", "persistentVolumeClaim": {"claimName": "fsx-2", "readOnly": True}},
                {
                    "name": "p",
                    "projected": {
                        "sources": [
                            {"secret": {"name": "s"}},
                            {"configMap": {"name": "c"}},
                            {"serviceAccountToken": {"path": "t"}},
                        ]
                    },
                },
            ],
            "initContainers": [{**SIDECAR, "name": "init-0", "env": env, "envFrom": env_from}],
            "containers": [
                {"name": "trainer", "volumeMounts": [{"name": "x" * 63, "mountPath": "/s"}]},
                {**SIDECAR, "envFrom": env_from, "env": env},
            ],
        }
    }
    parsed = parse_job(job_document(podTemplate=template, env=env))
    assert isinstance(parsed, JobRef), parsed


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"spec": {"containers": [{"name": "trainer", "volumeMounts": 5}]}}, "volumeMounts"),
        ({"spec": {"containers": [{"name": "trainer", "volumeMounts": ["a"]}]}}, "volumeMounts"),
        ({"spec": {"containers": 5}}, "spec.podTemplate.spec.containers"),
        ({"spec": {"volumes": [1, 2]}}, "spec.podTemplate.spec.volumes"),
        ({"metadata": {"labels": 5}}, "spec.podTemplate.metadata.labels"),
        # Names and lists inside otherwise well-formed content.
        (_volume(secret=5), "volumes[0].secret must be an object"),
        ({"spec": {"volumes": [{"name": 5}]}}, "volumes[0].name must be a string"),
        (_sidecar(envFrom="x"), "containers[0].envFrom must be a list"),
        (_sidecar(env=_env_from(secretKeyRef={"name": ["s"]})), "secretKeyRef.name must be"),
        (_volume(projected={"sources": {}}), "projected.sources must be a list"),
        ({"spec": {"imagePullSecrets": [{"name": None}, {"name": {}}]}}, "imagePullSecrets[1]"),
        (
            {"spec": {"containers": [{**SIDECAR, "name": ["x"]}, {**SIDECAR, "name": ["x"]}]}},
            "spec.podTemplate.spec.containers[1].name must be a string",
        ),
    ],
)
def test_pass_through_content_of_the_wrong_shape_is_a_problem_naming_it_not_a_crash(
    template: dict[str, object], field: str
) -> None:
    problems = parse_job(job_document(podTemplate=template))
    assert isinstance(problems, list), "accepted"
    assert any(field in problem for problem in problems), problems

"""spec.podTemplate is an allowlist (api/pod_fields.py): a pod field, container field, volume
type or projected source not on it is refused with the field named, by `parse_job` (and so by
`render` and the operator) and by the CRD's structural schema; and the operator always writes
the pod's ServiceAccount itself."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from trainium_operator.api import pod_fields
from trainium_operator.api.crd import training_job_crd
from trainium_operator.builders import pods
from trainium_operator.builders.job import JobRef, Stage
from trainium_operator.cli import main
from trainium_operator.lifecycle.parse import parse_job
from unit.jobs import job_document, job_ref


def problems_of(template: dict[str, Any], **spec: Any) -> list[str]:
    parsed = parse_job(job_document(podTemplate=template, **spec))
    assert not isinstance(parsed, JobRef), "expected the spec to be refused"
    # The spec's own checks come as one problem, joined with "; ".
    return [part for problem in parsed for part in problem.split("; ")]


def test_the_deprecated_service_account_alias_is_refused_naming_the_field_to_use() -> None:
    problems = problems_of({"spec": {"serviceAccount": "cluster-admin-sa"}})

    assert problems == [
        "spec.podTemplate.spec.serviceAccount is set by the operator (the deprecated alias of "
        "serviceAccountName: use spec.serviceAccountName)"
    ]


def test_pod_resource_claims_are_the_operators_naming_the_field_to_use() -> None:
    claims = [{"name": "gpus", "resourceClaimTemplateName": "sixteen-devices"}]
    problems = problems_of({"spec": {"resourceClaims": claims}})

    assert problems == [
        "spec.podTemplate.spec.resourceClaims is set by the operator (the operator claims the "
        "instance type's devices: use spec.deviceAllocation)"
    ]


@pytest.mark.parametrize(
    "field",
    ["runtimeClassName", "hostUsers", "os", "setHostnameAsFQDN", "overhead",
     "ephemeralContainers", "topologySpreadConstraints", "aNewPodFieldOf2030"],
)  # fmt: skip
def test_a_pod_field_not_on_the_allowlist_is_refused_naming_it(field: str) -> None:
    problems = problems_of({"spec": {field: {}}})

    assert problems == [
        f"spec.podTemplate.spec.{field} is not allowed: not a pod field a TrainingJob may set "
        "(docs/jobs.md lists what spec.podTemplate may set)"
    ]


@pytest.mark.parametrize(
    "volume_type",
    ["nfs", "iscsi", "rbd", "cephfs", "csi", "gitRepo", "ephemeral", "image", "glusterfs",
     "fc", "flexVolume", "awsElasticBlockStore"],
)  # fmt: skip
def test_a_volume_type_not_on_the_allowlist_is_refused_naming_it(volume_type: str) -> None:
    volume = {"name": "data", volume_type: {"server": "10.0.0.1", "path": "/"}}

    problems = problems_of({"spec": {"volumes": [{"name": "ok", "emptyDir": {}}, volume]}})

    assert len(problems) == 1
    assert problems[0].startswith(
        f"spec.podTemplate.spec.volumes[1].{volume_type} is not allowed: not a volume type"
    )


def test_a_projected_source_not_on_the_allowlist_is_refused_naming_it() -> None:
    volume = {
        "name": "certs",
        "projected": {
            "sources": [
                {"configMap": {"name": "ca"}},
                {"clusterTrustBundle": {"signerName": "x"}},
            ]
        },
    }

    problems = problems_of({"spec": {"volumes": [volume]}})

    assert [p.split(" is not allowed")[0] for p in problems] == [
        "spec.podTemplate.spec.volumes[0].projected.sources[1].clusterTrustBundle"
    ]


@pytest.mark.parametrize(
    ("list_name", "field"),
    [("containers", "volumeDevices"), ("initContainers", "volumeDevices"),
     ("containers", "restartPolicy"), ("containers", "stdin")],
)  # fmt: skip
def test_a_container_field_not_on_the_allowlist_is_refused_naming_it(
    list_name: str, field: str
) -> None:
    container = {"name": "side", "image": "busybox", field: "Always"}

    problems = problems_of({"spec": {list_name: [container]}})

    assert [p.split(" is not allowed")[0] for p in problems] == [
        f"spec.podTemplate.spec.{list_name}[0].{field}"
    ]


def test_the_allowed_fields_a_training_job_needs_pass() -> None:
    template = {
        "spec": {
            "volumes": [
                {"name": "ds", "persistentVolumeClaim": {"claimName": "datasets"}},
                {"name": "cfg", "configMap": {"name": "cfg"}},
                {"name": "creds", "secret": {"secretName": "creds"}},
                {"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "info", "downwardAPI": {"items": []}},
                {
                    "name": "all",
                    "projected": {
                        "sources": [
                            {"secret": {"name": "creds"}},
                            {"configMap": {"name": "cfg"}},
                            {"downwardAPI": {"items": []}},
                            {"serviceAccountToken": {"audience": "vault", "path": "t"}},
                        ]
                    },
                },
            ],
            "initContainers": [
                {"name": "proxy", "image": "envoy", "restartPolicy": "Always"},
            ],
            "containers": [
                {
                    "name": "exporter",
                    "image": "example.com/exporter:1",
                    "env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.uid"}}}],
                    "envFrom": [{"secretRef": {"name": "creds"}, "prefix": "X_"}],
                    "ports": [{"containerPort": 9100}],
                    "resources": {"limits": {"cpu": "1"}},
                    "readinessProbe": {"tcpSocket": {"port": 9100}},
                },
                {"name": "trainer", "volumeMounts": [{"name": "ds", "mountPath": "/ds"}]},
            ],
            "imagePullSecrets": [{"name": "ecr"}],
            "securityContext": {"fsGroup": 1000},
            "terminationGracePeriodSeconds": 60,
            "dnsPolicy": "ClusterFirst",
            "shareProcessNamespace": True,
            "automountServiceAccountToken": True,
        }
    }  # fmt: skip

    assert isinstance(parse_job(job_document(podTemplate=template)), JobRef)


def test_a_list_past_its_bound_is_one_problem_not_one_per_item() -> None:
    # Every item is refused on its own too (nfs, an unknown field): checked item by item, a
    # 20 000-item list would cost the operator 40 000 problems; past the bound it is one.
    volumes = [{"name": f"v{i}", "nfs": {"server": "x", "path": "/"}} for i in range(20_000)]
    containers = [{"name": "c", "image": "i", "stdin": True}] * 20_000

    problems = problems_of({"spec": {"volumes": volumes, "containers": containers}})

    # (Besides the spec's size as a whole: lifecycle/parse.MAX_SPEC_BYTES.)
    assert [p for p in problems if "bytes as JSON" not in p and "131072" not in p] == [
        f"spec.podTemplate.spec.volumes has 20000 items, at most {pod_fields.MAX_VOLUMES} are "
        "allowed",
        f"spec.podTemplate.spec.containers has 20000 items, at most {pod_fields.MAX_CONTAINERS} "
        "are allowed",
    ]


def test_many_unknown_fields_are_named_up_to_a_bound_each_cut_short() -> None:
    template = {"spec": {f"field{i}": 1 for i in range(1000)} | {"x" * 5000: 1}}

    problems = problems_of(template)

    assert len(problems) == 9
    assert problems[-1] == "spec.podTemplate.spec: 993 more fields not allowed"
    assert max(len(p) for p in problems) < 200


@pytest.mark.parametrize("spec", [{}, {"serviceAccountName": "team-runner"}])
def test_every_pod_names_its_service_account(spec: dict[str, Any]) -> None:
    job = job_ref(**spec)

    for stage in (Stage.COMPILE, Stage.TRAIN):
        pod_spec = pods.pod(job, stage, 0, 0)["spec"]
        assert pod_spec["serviceAccountName"] == spec.get("serviceAccountName", "default")
        assert "serviceAccount" not in pod_spec


def test_sidecars_and_init_containers_get_the_hardened_security_context_under_their_own() -> None:
    template = {
        "spec": {
            "initContainers": [{"name": "fetch", "image": "busybox"}],
            "containers": [
                {
                    "name": "side",
                    "image": "busybox",
                    "securityContext": {"runAsUser": 1000, "capabilities": {"add": ["CHOWN"]}},
                },
                {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}},
            ],
        }
    }

    spec = pods.pod(job_ref(podTemplate=template), Stage.TRAIN, 0, 0)["spec"]

    assert spec["initContainers"][0]["securityContext"] == pods.TRAINING_CONTAINER_SECURITY_CONTEXT
    side, debug = spec["containers"][1:]
    assert side["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "runAsUser": 1000,
        "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]},
    }
    # A privileged container (its author was granted it) cannot also forbid escalation.
    assert debug["securityContext"] == {"privileged": True, "capabilities": {"drop": ["ALL"]}}


def _pod_spec_schema() -> dict[str, Any]:
    schema = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pod_spec: dict[str, Any] = schema["properties"]["spec"]["properties"]["podTemplate"][
        "properties"
    ]["spec"]
    return pod_spec


def test_the_crd_declares_the_allowlist_and_passes_no_other_pod_field_through() -> None:
    schema = _pod_spec_schema()

    assert "x-kubernetes-preserve-unknown-fields" not in schema
    assert set(schema["properties"]) == set(pod_fields.POD_FIELDS) | set(
        pod_fields.RESERVED_POD_FIELDS
    )
    volume = schema["properties"]["volumes"]["items"]
    assert "x-kubernetes-preserve-unknown-fields" not in volume
    assert set(volume["properties"]) == {"name", *pod_fields.VOLUME_TYPES}
    container = schema["properties"]["containers"]["items"]
    assert "x-kubernetes-preserve-unknown-fields" not in container
    assert "volumeDevices" not in container["properties"]
    assert schema["properties"]["volumes"]["maxItems"] == pod_fields.MAX_VOLUMES


def test_the_crd_refuses_every_reserved_field_by_name_with_a_rule() -> None:
    rules = {r["fieldPath"]: r for r in _pod_spec_schema()["x-kubernetes-validations"]}

    assert set(rules) == {f".{name}" for name in pod_fields.RESERVED_POD_FIELDS}
    assert rules[".serviceAccount"]["rule"] == "!has(self.serviceAccount)"
    assert "use spec.serviceAccountName" in rules[".serviceAccount"]["message"]


# -- upgrade: a job admitted before the allowlist ---------------------------------------------

GRANDFATHERED = {
    "spec": {
        "serviceAccount": "ci-admin",
        "runtimeClassName": "kata",
        "volumes": [{"name": "nas", "nfs": {"server": "10.0.0.9", "path": "/"}}],
        "containers": [{"name": "side", "image": "busybox", "volumeDevices": []}],
    }
}
DROPPED = (
    "spec.podTemplate.spec.serviceAccount",
    "spec.podTemplate.spec.runtimeClassName",
    "spec.podTemplate.spec.volumes[0].nfs",
    "spec.podTemplate.spec.containers[0].volumeDevices",
)


def test_a_job_the_operator_ran_before_keeps_running_without_the_refused_fields() -> None:
    document = job_document(podTemplate=GRANDFATHERED)
    document["status"] = {"phase": "Training"}

    parsed = parse_job(document)

    assert isinstance(parsed, JobRef), parsed
    assert parsed.dropped_pod_fields == DROPPED
    pod_spec = pods.pod(parsed, Stage.TRAIN, 1, 0)["spec"]
    assert "serviceAccount" not in pod_spec
    assert "runtimeClassName" not in pod_spec
    # The volume goes whole: an emptyDir in its place would silently mount nothing.
    assert [v["name"] for v in pod_spec["volumes"]] == ["dshm", "shared-data"]
    assert "volumeDevices" not in pod_spec["containers"][1]


def test_a_new_job_with_the_same_fields_is_refused() -> None:
    problems = problems_of(GRANDFATHERED)

    assert sorted(p.split(" is ")[0] for p in problems) == sorted(DROPPED)


# -- `trainium-operator render`: what the operator would create ------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bert-large-pretrain.yaml"


def test_render_names_the_service_account_in_every_pod_and_refuses_the_alias(
    tmp_path: Path,
) -> None:
    rendered = CliRunner().invoke(main, ["render", "-f", str(EXAMPLE)])
    assert rendered.exit_code == 0, rendered.output
    accounts = [
        o["spec"].get("serviceAccountName")
        for o in yaml.safe_load_all(rendered.output)
        if o["kind"] == "Pod"
    ]
    assert accounts
    assert set(accounts) == {"default"}

    document = yaml.safe_load(EXAMPLE.read_text())
    document["spec"]["podTemplate"] = {"spec": {"serviceAccount": "ci-admin"}}
    aliased = tmp_path / "alias.yaml"
    aliased.write_text(yaml.safe_dump(document))
    refused = CliRunner().invoke(main, ["render", "-f", str(aliased)])

    assert refused.exit_code != 0
    assert "spec.podTemplate.spec.serviceAccount is set by the operator" in refused.output
    assert "serviceAccount: ci-admin" not in refused.output


def test_a_pass_through_integer_out_of_its_range_is_refused_naming_the_field() -> None:
    # A deleted pod holds its whole Trainium node for its grace period: a tenant's 2**31 s
    # would keep it from the next gang for decades.
    parsed = parse_job(job_document(podTemplate={"spec": {"terminationGracePeriodSeconds": 2**31}}))
    assert isinstance(parsed, list)
    assert any("terminationGracePeriodSeconds must be between 0 and 3600" in p for p in parsed)
    assert isinstance(
        parse_job(job_document(podTemplate={"spec": {"terminationGracePeriodSeconds": 60}})),
        JobRef,
    )

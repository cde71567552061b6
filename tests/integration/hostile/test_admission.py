"""Admission, played by a hostile author: a tenant who may only manage TrainingJobs (and get the
default claim) in a workload namespace tries to have the operator, which creates the pods with
its own rights, hand their pods what they may not have: another ServiceAccount through the
deprecated alias, Secrets (env, envFrom, secret and projected volumes, a ServiceAccount's token
Secret), another team's claim, network and node-level volumes, and pod fields off the allowlist.

Each is refused with the field named: by the chart's tenancy policy (403, rendered from the
chart as the chart ships it) or by the CRD's structural schema (422 for a strict client such as
kubectl; any other write has the field dropped, so it never reaches a pod). Then the same
objects, granted, get through. One policy install for the module, many attempts per test.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from integration.hostile.conftest import HostileReport
from integration.operator_harness import GROUP, PLURAL, VERSION, job_manifest
from integration.tenancy_harness import (
    OTHER_TENANT,
    TENANT,
    Tenancy,
    create,
    installed_tenancy,
    label_pod_security,
)
from trainium_devcluster.sim import wait_for

SECRET = "team-b-creds"
TOKEN_SECRET = "ci-deployer-token"
CLAIM = "team-b-data"


@pytest.fixture(scope="module")
def tenancy(dev_cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tenancy]:
    with installed_tenancy(dev_cluster, tmp_path_factory.mktemp("admission")) as state:
        core = client.CoreV1Api(dev_cluster.clients.api_client)
        # What the admin keeps in the namespace: a ServiceAccount with a long-lived token Secret.
        core.create_namespaced_service_account(state.team, {"metadata": {"name": "ci-deployer"}})
        core.create_namespaced_secret(
            state.team,
            {
                "metadata": {
                    "name": TOKEN_SECRET,
                    "annotations": {"kubernetes.io/service-account.name": "ci-deployer"},
                },
                "type": "kubernetes.io/service-account-token",
            },
        )
        yield state


def _pod(**spec: Any) -> dict[str, Any]:
    return {"podTemplate": {"spec": spec}}


def _sidecar(**fields: Any) -> dict[str, Any]:
    return _pod(containers=[{"name": "side", "image": "busybox", **fields}])


def _volume(name: str, **source: Any) -> dict[str, Any]:
    return _pod(volumes=[{"name": name, **source}])


def _secret_env() -> dict[str, Any]:
    return {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "token"}}}


# What the tenant tries (spec overrides), the field the policy's refusal names, and what else.
POLICY_ATTEMPTS: dict[str, tuple[dict[str, Any], str, str]] = {
    "secret-in-spec-env": (
        {"env": [_secret_env()]},
        f"spec.env[TOKEN].valueFrom.secretKeyRef (Secret {SECRET})",
        'needs verb "get" on secrets',
    ),
    "secret-in-sidecar-env": (
        _sidecar(env=[_secret_env()]),
        "spec.podTemplate.spec.containers[side].env[TOKEN].valueFrom.secretKeyRef"
        f" (Secret {SECRET})",
        'needs verb "get" on secrets',
    ),
    "secret-in-init-envfrom": (
        _pod(
            initContainers=[
                {"name": "init", "image": "b", "envFrom": [{"secretRef": {"name": SECRET}}]}
            ]
        ),
        f"spec.podTemplate.spec.initContainers[init].envFrom (Secret {SECRET})",
        'needs verb "get" on secrets',
    ),
    "secret-volume": (
        _volume("creds", secret={"secretName": SECRET}),
        f"spec.podTemplate.spec.volumes[creds].secret (Secret {SECRET})",
        'needs verb "get" on secrets',
    ),
    "projected-secret": (
        _volume("creds", projected={"sources": [{"secret": {"name": SECRET}}]}),
        f"spec.podTemplate.spec.volumes[creds].projected.sources (Secret {SECRET})",
        'needs verb "get" on secrets',
    ),
    "service-account-token-secret": (
        _volume("token", secret={"secretName": TOKEN_SECRET}),
        f"spec.podTemplate.spec.volumes[token].secret (Secret {TOKEN_SECRET})",
        'needs verb "get" on secrets',
    ),
    "other-teams-claim-volume": (
        _volume("data", persistentVolumeClaim={"claimName": CLAIM}),
        "spec.podTemplate.spec.volumes[data].persistentVolumeClaim"
        f" (PersistentVolumeClaim {CLAIM})",
        'needs verb "get" on persistentvolumeclaims',
    ),
    "other-teams-claim-storage": (
        {"storage": {"claimName": CLAIM}},
        f"spec.storage.claimName (PersistentVolumeClaim {CLAIM})",
        'needs verb "get" on persistentvolumeclaims',
    ),
    "host-path-volume": (
        _volume("root", hostPath={"path": "/"}),
        "spec.podTemplate.spec.volumes[root].hostPath",
        'needs verb "use" on trainingjobs/hostpath',
    ),
}
# Refused by the CRD itself: the field named, before any policy runs.
SCHEMA_ATTEMPTS: dict[str, tuple[dict[str, Any], str]] = {
    "service-account-alias": (
        _pod(serviceAccount="ci-deployer"),
        "spec.podTemplate.spec.serviceAccount",
    ),
    "unknown-pod-field": (
        _pod(runtimeClassName="privileged"),
        "spec.podTemplate.spec.runtimeClassName",
    ),
    "ephemeral-container": (
        _pod(ephemeralContainers=[{"name": "x", "image": "b"}]),
        "spec.podTemplate.spec.ephemeralContainers",
    ),
    "raw-block-device": (
        _sidecar(volumeDevices=[{"name": "d", "devicePath": "/dev/x"}]),
        "spec.podTemplate.spec.containers[0].volumeDevices",
    ),
    "nfs": (
        _volume("v", nfs={"server": "10.0.0.9", "path": "/"}),
        "spec.podTemplate.spec.volumes[0].nfs",
    ),
    "iscsi": (
        _volume("v", iscsi={"targetPortal": "10.0.0.9:3260", "iqn": "iqn.x", "lun": 0}),
        "spec.podTemplate.spec.volumes[0].iscsi",
    ),
    "rbd": (
        _volume("v", rbd={"monitors": ["10.0.0.9"], "image": "x"}),
        "spec.podTemplate.spec.volumes[0].rbd",
    ),
    "cephfs": (
        _volume("v", cephfs={"monitors": ["10.0.0.9"]}),
        "spec.podTemplate.spec.volumes[0].cephfs",
    ),
    "inline-csi": (
        _volume("v", csi={"driver": "secrets-store.csi.k8s.io"}),
        "spec.podTemplate.spec.volumes[0].csi",
    ),
    "git-repo": (
        _volume("v", gitRepo={"repository": "https://example.com/x.git"}),
        "spec.podTemplate.spec.volumes[0].gitRepo",
    ),
    "projected-trust-bundle": (
        _volume("v", projected={"sources": [{"clusterTrustBundle": {"signerName": "x"}}]}),
        "spec.podTemplate.spec.volumes[0].projected.sources[0].clusterTrustBundle",
    ),
}


def _try(api: Any, namespace: str, manifest: dict[str, Any], **options: Any) -> tuple[int, str]:
    """The API server's answer to this create as a dry run: (HTTP status, message)."""
    try:
        stored = api.create_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, manifest, dry_run="All", **options
        )
    except ApiException as error:
        return error.status, str(json.loads(error.body)["message"])
    return 201, json.dumps(stored["spec"])


def test_a_tenant_is_refused_each_object_it_may_not_read_naming_the_field_and_the_right(
    tenancy: Tenancy, hostile_report: HostileReport
) -> None:
    alice = tenancy.as_user(TENANT)
    for attempt, (spec, field, right) in POLICY_ATTEMPTS.items():
        status, message = _try(alice, tenancy.team, job_manifest(f"h-{attempt}", **spec))
        hostile_report.tried(field.split(" (")[0], attempt, f"{status} {message[-160:]}")

        assert status == 403, (attempt, message)
        assert field in message, attempt
        assert right in message, attempt
        assert TENANT in message, attempt


def test_fields_off_the_allowlist_are_refused_by_the_crd_naming_them_and_never_stored(
    tenancy: Tenancy, hostile_report: HostileReport
) -> None:
    alice = tenancy.as_user(TENANT)
    for attempt, (spec, field) in SCHEMA_ATTEMPTS.items():
        manifest = job_manifest(f"h-{attempt}", **spec)
        # kubectl's default: strict field validation.
        status, message = _try(alice, tenancy.team, manifest, field_validation="Strict")
        hostile_report.tried(field, f"{attempt} (strict)", f"{status} {message[-160:]}")
        # 400 for a field the schema does not declare, 422 for a declared one a rule refuses.
        assert status in (400, 422), (attempt, message)
        assert field in message, (attempt, message)

        # Any other client: the API server drops what the schema does not declare.
        status, stored = _try(alice, tenancy.team, manifest)
        name = field.rsplit(".", 1)[-1]
        outcome = "refused" if status != 201 else f"dropped: {name} not in the stored job"
        hostile_report.tried(field, f"{attempt} (default)", f"{status} {outcome}")
        assert status != 201 or f'"{name}"' not in stored, (attempt, stored)


def test_the_same_objects_pass_once_the_tenant_may_get_them_and_only_for_that_tenant(
    tenancy: Tenancy, hostile_report: HostileReport
) -> None:
    alice = tenancy.as_user(TENANT)
    tenancy.grant(
        TENANT,
        tenancy.team,
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [SECRET], "verbs": ["get"]},
    )
    tenancy.grant(
        TENANT,
        tenancy.team,
        {
            "apiGroups": [""],
            "resources": ["persistentvolumeclaims"],
            "resourceNames": [CLAIM],
            "verbs": ["get"],
        },
    )
    granted = job_manifest(
        "granted",
        env=[_secret_env()],
        storage={"claimName": CLAIM},
        podTemplate={
            "spec": {
                "volumes": [
                    {"name": "creds", "secret": {"secretName": SECRET}},
                    {"name": "proj", "projected": {"sources": [{"secret": {"name": SECRET}}]}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": CLAIM}},
                ],
                "containers": [
                    {"name": "side", "image": "b", "envFrom": [{"secretRef": {"name": SECRET}}]}
                ],
            }
        },
    )
    wait_for(
        lambda: _try(alice, tenancy.team, granted),
        until=lambda answer: answer[0] == 201,
        timeout=30,
        description="the job naming granted Secrets and claims accepted",
    )
    create(alice, tenancy.team, granted)
    hostile_report.tried("spec.env, podTemplate volumes", "granted secret + claim", "201 created")

    # The grant is the author's: the other tenant's identical job is refused.
    status, message = _try(
        tenancy.as_user(OTHER_TENANT), tenancy.team, {**granted, "metadata": {"name": "bob"}}
    )
    hostile_report.tried("spec.env[TOKEN]", "same job, other tenant", f"{status}")
    assert status == 403
    assert f"Secret {SECRET}" in message
    # The token Secret was not granted, so it stays out even beside granted objects.
    token = {"name": "token", "secret": {"secretName": TOKEN_SECRET}}
    status, message = _try(alice, tenancy.team, job_manifest("token", **_pod(volumes=[token])))
    hostile_report.tried("volumes[token].secret", "ungranted token beside grants", f"{status}")
    assert status == 403
    assert TOKEN_SECRET in message


def test_a_job_naming_more_secrets_than_the_policy_checks_is_refused_not_a_cost_error(
    tenancy: Tenancy, hostile_report: HostileReport
) -> None:
    """An authorizer check costs a third of a CEL expression's budget, so the policy checks at
    most 8 distinct Secrets (64 references) per job: a job past that, up to the largest the CRD
    allows, is refused by a decision naming the bound, never by a CEL cost error."""
    alice = tenancy.as_user(TENANT)
    env = [
        {"name": f"V{i}", "valueFrom": {"secretKeyRef": {"name": f"s{i}", "key": "k"}}}
        for i in range(256)
    ]
    sidecars = [
        {"name": f"c{i}", "image": "b", "env": env[:64], "envFrom": [{"secretRef": {"name": "s"}}]}
        for i in range(4)
    ]
    volumes = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": f"c{i}"}} for i in range(64)
    ]
    manifest = job_manifest(
        "big", env=env, podTemplate={"spec": {"containers": sidecars, "volumes": volumes}}
    )

    status, message = _try(alice, tenancy.team, manifest)
    hostile_report.tried("spec.env, containers[].env", "516 Secret references", f"{status}")

    assert status == 403, message
    # Refused by a decision, not a CEL error; the list of 500 names passes the 5 KiB bound of
    # an evaluated message, so the policy's static one says what to grant.
    assert "a TrainingJob names at most 8 Secrets (64 references)" in message, message[:500]
    assert "cost" not in message, message[:500]
    # Nine distinct Secrets, each needing its own check, are more than the policy makes.
    nine = job_manifest("nine", env=env[:9])
    status, message = _try(alice, tenancy.team, nine)
    assert status == 403, message
    assert message.split(": ", 2)[-1].startswith("spec.env[V0].valueFrom.secretKeyRef"), message
    assert "a TrainingJob names at most 8 Secrets" in message


def test_the_largest_job_passes_for_an_author_who_may_get_every_secret_and_claim(
    tenancy: Tenancy, hostile_report: HostileReport
) -> None:
    """The namespace-wide grant is one check however many Secrets and claims a job names: the
    largest job the CRD allows is admitted, not cancelled for CEL cost."""
    bob = tenancy.as_user(OTHER_TENANT)
    tenancy.grant(
        OTHER_TENANT,
        tenancy.team,
        {"apiGroups": [""], "resources": ["secrets", "persistentvolumeclaims"], "verbs": ["get"]},
    )
    env = [
        {"name": f"V{i}", "valueFrom": {"secretKeyRef": {"name": f"s{i}", "key": "k"}}}
        for i in range(256)
    ]
    sidecars = [
        {"name": f"c{i}", "image": "b", "env": env, "envFrom": [{"secretRef": {"name": "s"}}] * 64}
        for i in range(15)
    ]
    volumes = [
        {"name": f"v{i}", "persistentVolumeClaim": {"claimName": f"c{i}"}} for i in range(64)
    ]
    manifest = job_manifest(
        "largest", env=env, podTemplate={"spec": {"containers": sidecars, "volumes": volumes}}
    )

    status, answer = wait_for(
        lambda: _try(bob, tenancy.team, manifest),
        until=lambda result: result[0] != 403 or "needs verb" not in result[1],
        timeout=30,
        description="the namespace-wide grant reaching the authorizer",
    )
    hostile_report.tried(
        "spec.env, containers, volumes", "largest job, namespace-wide get", f"{status}"
    )

    assert status == 201, answer[:500]


def test_a_field_stored_before_the_allowlist_is_what_the_api_server_serves_after_it(
    tenancy: Tenancy, dev_cluster: Any, hostile_report: HostileReport
) -> None:
    """The upgrade path on the real API server: a job stored under a CRD that passed any pod
    field through (as before the allowlist), read back once the allowlist CRD is in place. What
    the API server serves decides what the operator sees: docs/jobs.md, "Upgrading"."""
    extensions = dev_cluster.clients.apiextensions
    name = "trainingjobs.trainium.dev"
    current = extensions.read_custom_resource_definition(name)
    allowlist = dev_cluster.clients.api_client.sanitize_for_serialization(current)
    before = copy.deepcopy(allowlist)
    schema = before["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    pod_spec = schema["properties"]["spec"]["properties"]["podTemplate"]["properties"]["spec"]
    pod_spec["x-kubernetes-preserve-unknown-fields"] = True
    try:
        extensions.replace_custom_resource_definition(name, before)
        old = job_manifest("stored-before", **_pod(runtimeClassName="kata"))
        old["spec"]["runPolicy"] = {"suspend": True}
        # Until the pass-through schema is in force, a write would be pruned already.
        wait_for(
            lambda: _try(tenancy.admin, tenancy.team, old),
            until=lambda answer: answer[0] == 201 and '"runtimeClassName"' in answer[1],
            timeout=30,
            description="the pass-through CRD in force",
        )
        stored = tenancy.admin.create_namespaced_custom_object(
            GROUP, VERSION, tenancy.team, PLURAL, old
        )
        assert stored["spec"]["podTemplate"]["spec"]["runtimeClassName"] == "kata"
    finally:
        latest = extensions.read_custom_resource_definition(name)
        allowlist["metadata"]["resourceVersion"] = latest.metadata.resource_version
        extensions.replace_custom_resource_definition(name, allowlist)

    def served() -> dict[str, Any]:
        job = tenancy.admin.get_namespaced_custom_object(
            GROUP, VERSION, tenancy.team, PLURAL, "stored-before"
        )
        spec: dict[str, Any] = job["spec"]["podTemplate"]["spec"]
        return spec

    # The new schema applies within moments of the replace; pruning on read drops the field.
    pod_fields = wait_for(
        served,
        until=lambda spec: "runtimeClassName" not in spec,
        timeout=30,
        description="the stored job served without the field the allowlist refuses",
    )
    hostile_report.tried(
        "spec.podTemplate.spec.runtimeClassName",
        "stored before the allowlist CRD",
        f"served after it without the field ({sorted(pod_fields)})",
    )


def test_a_new_job_in_a_namespace_that_enforces_no_pod_security_level_is_refused(
    dev_cluster: Any, tenancy: Tenancy, hostile_report: HostileReport
) -> None:
    # The pass-through securityContext (sysctls, seLinuxOptions, procMount) is Pod Security's
    # to judge; an unlabelled namespace judges nothing, so the policy takes no new job there.
    alice = tenancy.as_user(TENANT)
    label_pod_security(dev_cluster, tenancy.team, None)
    try:
        manifest = job_manifest("h-unlabelled", **_pod(securityContext={"sysctls": []}))

        _, message = wait_for(
            lambda: _try(alice, tenancy.team, manifest),
            until=lambda answer: answer[0] == 403,
            timeout=15,
            description="the policy seeing the namespace unlabelled",
        )
        hostile_report.tried(
            "namespace pod-security label", "a job where no level is enforced", message[-160:]
        )
        assert "pod-security.kubernetes.io/enforce" in message
        assert "kubectl label namespace" in message
    finally:
        label_pod_security(dev_cluster, tenancy.team, "baseline")


def test_a_priority_class_is_refused_unless_its_author_may_use_it_by_name(
    tenancy: Tenancy, hostile_report: HostileReport
) -> None:
    # A higher PriorityClass lets a gang preempt other teams' pods: the chart's default asks
    # the author's own grant for every class.
    alice, bob = tenancy.as_user(TENANT), tenancy.as_user(OTHER_TENANT)
    urgent = job_manifest("h-urgent", scheduling={"priorityClassName": "urgent-training"})
    status, message = _try(alice, tenancy.team, urgent)
    hostile_report.tried("spec.scheduling.priorityClassName", "ungranted class", f"{status}")
    assert status == 403, message
    assert "spec.scheduling.priorityClassName" in message
    assert 'needs verb "use" on priorityclasses' in message

    tenancy.grant(
        TENANT,
        tenancy.team,
        {
            "apiGroups": ["scheduling.k8s.io"],
            "resources": ["priorityclasses"],
            "resourceNames": ["urgent-training"],
            "verbs": ["use"],
        },
    )
    granted = wait_for(
        lambda: _try(alice, tenancy.team, urgent),
        until=lambda answer: answer[0] == 201,
        timeout=15,
        description="the granted class admitted",
    )
    hostile_report.tried("spec.scheduling.priorityClassName", "granted class", f"{granted[0]}")
    other, _ = _try(bob, tenancy.team, urgent)
    hostile_report.tried("spec.scheduling.priorityClassName", "another's grant", f"{other}")
    assert other == 403

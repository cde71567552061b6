"""The chart rendered by the real helm binary: lint, Kubernetes schema validity, each switch."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart.chart_harness import (
    CHART_DIR,
    EVERYTHING,
    FSX_ON,
    FULLNAME,
    RELEASE_NAMESPACE,
    SCENARIOS,
    SKIPPED_KINDS,
    SWITCHES,
    Manifest,
    find,
    helm,
    load_all,
    one,
    render,
    template_args,
    validate_manifest,
    values_file,
)
from trainium_operator.api.instance_types import INSTANCE_TYPES
from trainium_operator.builders.job import LABEL_JOB_NAME
from trainium_operator.controller import health_role
from trainium_operator.controller.settings import (
    ENV_JOB_NETWORK_POLICY,
    ENV_PROFILE_S3_URI,
    ENV_PROFILE_UPLOAD_SERVICE_ACCOUNT,
)

# The operator and the tenancy admission policy that checks TrainingJob authors.
DEFAULT_KINDS = {
    "ClusterRole",
    "ClusterRoleBinding",
    "Deployment",
    "NetworkPolicy",
    "Service",
    "ServiceAccount",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def operator_container(manifests: list[Manifest]) -> dict[str, Any]:
    deployment = one(manifests, "Deployment", FULLNAME)
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["operator"]
    container: dict[str, Any] = containers[0]
    return container


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_helm_lint_strict_passes(scenario: str, tmp_path: Path) -> None:
    path = values_file(SCENARIOS[scenario], tmp_path)
    result = helm("lint", "--strict", str(CHART_DIR), "--values", str(path), check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_validates_against_kubernetes_1_35(
    scenario: str, tmp_path: Path
) -> None:
    manifests = render(SCENARIOS[scenario], tmp_path)
    assert manifests
    for manifest in manifests:
        validate_manifest(manifest)


def test_the_chart_crds_validate_as_custom_resource_definitions() -> None:
    crds = [
        doc
        for path in sorted((CHART_DIR / "crds").glob("*.yaml"))
        for doc in load_all(path.read_text())
        if doc
    ]
    names = {crd["metadata"]["name"] for crd in crds}
    assert {
        "trainingjobs.trainium.dev",
        "kopfpeerings.kopf.dev",
        "clusterkopfpeerings.kopf.dev",
    } <= names
    for crd in crds:
        validate_manifest(crd)


def test_schema_validation_catches_an_invalid_object() -> None:
    # The validator itself must be able to fail: a Deployment with a misspelled field.
    broken = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x"},
        "spec": {"selector": {}, "template": {"spec": {"containers": []}}, "replica": 1},
    }
    with pytest.raises(AssertionError, match="replica"):
        validate_manifest(broken)


@pytest.mark.parametrize(
    ("api_version", "kind", "misspelled_spec"),
    [
        ("scheduling.volcano.sh/v1beta1", "Queue", {"wieght": 1}),
        ("kopf.dev/v1", "ClusterKopfPeering", {"priority": 1}),
        ("kueue.x-k8s.io/v1beta2", "ClusterQueue", {"resourceGroup": []}),
    ],
    ids=["volcano-queue", "kopf-peering", "kueue-cluster-queue"],
)
def test_custom_resources_are_checked_against_their_crd(
    api_version: str, kind: str, misspelled_spec: dict[str, int]
) -> None:
    manifest = {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}
    with pytest.raises(AssertionError, match="Additional properties"):
        validate_manifest({**manifest, "spec": misspelled_spec})


def test_only_the_service_monitor_skips_schema_validation() -> None:
    assert set(SKIPPED_KINDS) == {("monitoring.coreos.com/v1", "ServiceMonitor")}


def test_defaults_render_only_the_operator_and_its_tenancy_policy(tmp_path: Path) -> None:
    manifests = render({}, tmp_path)
    assert {m["kind"] for m in manifests} == DEFAULT_KINDS
    assert {
        (m["kind"], m["metadata"].get("namespace"))
        for m in manifests
        if m["kind"] in {"Deployment", "Service", "ServiceAccount"}
    } == {
        ("Deployment", RELEASE_NAMESPACE),
        ("Service", RELEASE_NAMESPACE),
        ("ServiceAccount", RELEASE_NAMESPACE),
    }


def test_operator_pod_is_locked_down(tmp_path: Path) -> None:
    manifests = render({}, tmp_path)
    pod = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["spec"]
    container = operator_container(manifests)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["privileged"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    assert container["resources"]["limits"]["memory"] == "512Mi"
    # The only writable path is an emptyDir at /tmp.
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["serviceAccountName"] == FULLNAME


def test_operator_runs_the_contracted_command_line(tmp_path: Path) -> None:
    container = operator_container(render({}, tmp_path))
    assert container["command"] == ["trainium-operator"]
    assert container["args"] == [
        "run",
        "--liveness-endpoint=http://0.0.0.0:8080/healthz",
        "--metrics-port=8081",
        "--health-port=8090",
        "--health-url=http://trn-trainium-operator-health.trainium-system.svc:8090/v1/progress",
        "--log-format=json",
    ]
    assert container["image"] == "trainium-operator:0.1.0"


def test_health_channel_is_served_behind_its_service_and_can_be_turned_off(
    tmp_path: Path,
) -> None:
    manifests = render({}, tmp_path)
    (service,) = [
        m for m in manifests if m["kind"] == "Service" and m["metadata"]["name"].endswith("-health")
    ]
    assert service["spec"]["ports"] == [
        {"name": "health-channel", "port": 8090, "targetPort": "health-channel", "protocol": "TCP"}
    ]
    ports = {p["name"]: p["containerPort"] for p in operator_container(manifests)["ports"]}
    assert ports["health-channel"] == 8090
    (tmp_path / "off").mkdir()
    off = render({"health": {"enabled": False}}, tmp_path / "off")
    assert not any(a.startswith("--health") for a in operator_container(off)["args"])
    assert not [m for m in off if m["metadata"]["name"].endswith("-health")]


def test_probes_use_kopfs_health_endpoint(tmp_path: Path) -> None:
    container = operator_container(render({}, tmp_path))
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 8081, "health-channel": 8090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_image_digest_wins_over_the_tag(tmp_path: Path) -> None:
    digest = "sha256:" + "ab" * 32
    values = {"image": {"repository": "123.dkr.ecr.us-west-2.amazonaws.com/op", "digest": digest}}
    container = operator_container(render(values, tmp_path))
    assert container["image"] == f"123.dkr.ecr.us-west-2.amazonaws.com/op@{digest}"


def test_watch_namespaces_become_namespace_options(tmp_path: Path) -> None:
    container = operator_container(render({"watchNamespaces": ["team-a", "team-b"]}, tmp_path))
    assert container["args"][:3] == ["run", "--namespace=team-a", "--namespace=team-b"]


def test_standalone_operator_is_one_replica_replaced_not_rolled(tmp_path: Path) -> None:
    manifests = render({}, tmp_path)
    deployment = one(manifests, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not find(manifests, "PodDisruptionBudget")
    assert not any("--peering" in arg for arg in operator_container(manifests)["args"])


def test_peering_runs_two_replicas_with_a_cluster_peering_object(tmp_path: Path) -> None:
    manifests = render(SWITCHES["peering"], tmp_path)
    deployment = one(manifests, "Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    assert "--peering=trainium-operator" in operator_container(manifests)["args"]
    assert "--peering-lifetime=60" in operator_container(manifests)["args"]
    peering = one(manifests, "ClusterKopfPeering", "trainium-operator")
    assert peering["apiVersion"] == "kopf.dev/v1"
    assert one(manifests, "PodDisruptionBudget")["spec"]["minAvailable"] == 1


def test_the_health_service_selects_the_acting_replica_only_under_peering(
    tmp_path: Path,
) -> None:
    """Peered: the Service routes to the pod the acting replica labels (health_role.LABEL),
    which learns its own pod's name and namespace from the downward API through its flags."""
    health = f"{FULLNAME}-health"
    deployment_labels = one(render({}, tmp_path), "Deployment", FULLNAME)["spec"]["selector"]
    standalone = render({}, tmp_path)
    assert (
        one(standalone, "Service", health)["spec"]["selector"] == (deployment_labels["matchLabels"])
    )
    args = operator_container(standalone)["args"]
    assert not any(arg.startswith("--pod-") for arg in args)

    peered = render(SWITCHES["peering"], tmp_path)
    selector = one(peered, "Service", health)["spec"]["selector"]
    assert selector == {**deployment_labels["matchLabels"], health_role.LABEL: health_role.ACTIVE}
    container = operator_container(peered)
    assert "--pod-name=$(TRAINIUM_POD_NAME)" in container["args"]
    assert "--pod-namespace=$(TRAINIUM_POD_NAMESPACE)" in container["args"]
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["TRAINIUM_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["TRAINIUM_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    # The label is the operator's to set: the pod template never fixes it.
    template = one(peered, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    assert health_role.LABEL not in template


def test_namespaced_peering_creates_a_peering_object_per_namespace(tmp_path: Path) -> None:
    values = {"peering": {"enabled": True, "name": "ops"}, "watchNamespaces": ["a", "b"]}
    manifests = render(values, tmp_path)
    assert not find(manifests, "ClusterKopfPeering")
    peerings = find(manifests, "KopfPeering", "ops")
    assert sorted(p["metadata"]["namespace"] for p in peerings) == ["a", "b"]


def test_several_replicas_without_peering_are_refused(tmp_path: Path) -> None:
    result = helm(*template_args({"replicaCount": 2}, tmp_path), check=False)
    assert result.returncode != 0
    assert "needs peering.enabled=true" in result.stderr


def test_metrics_service_and_service_monitor_point_at_the_metrics_port(tmp_path: Path) -> None:
    manifests = render(
        {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
        tmp_path,
    )
    service = one(manifests, "Service", f"{FULLNAME}-metrics")
    assert service["spec"]["ports"] == [
        {"name": "metrics", "port": 8081, "targetPort": "metrics", "protocol": "TCP"}
    ]
    pod_labels = one(manifests, "Deployment", FULLNAME)["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = one(manifests, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "30s", "scrapeTimeout": "10s"}
    ]


def test_service_monitor_without_the_service_is_refused(tmp_path: Path) -> None:
    values = {"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}}
    result = helm(*template_args(values, tmp_path), check=False)
    assert result.returncode != 0
    assert "needs metrics.service.enabled=true" in result.stderr


def test_volcano_queue_has_the_tutorials_settings(tmp_path: Path) -> None:
    queue = one(render(SWITCHES["volcano-queue"], tmp_path), "Queue", "test")
    assert queue["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert "namespace" not in queue["metadata"]
    assert queue["spec"] == {"weight": 1, "reclaimable": False, "capability": {"cpu": "2"}}


def test_etcd_serves_the_v2_api_at_etcd_server_2379(tmp_path: Path) -> None:
    manifests = render({**SWITCHES["etcd"], "workloadNamespace": "default"}, tmp_path)
    deployment = one(manifests, "Deployment", "etcd-server")
    assert deployment["metadata"]["namespace"] == "default"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "quay.io/coreos/etcd:v3.5.21"
    assert "--enable-v2=true" in container["command"]
    assert "--advertise-client-urls=http://etcd-server:2379" in container["command"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["exec"]["command"][0] == "/usr/local/bin/etcdctl"
    service = one(manifests, "Service", "etcd-server")
    assert service["metadata"]["namespace"] == "default"
    assert {p["port"] for p in service["spec"]["ports"]} == {2379, 2380}
    assert service["spec"]["selector"].items() <= (
        deployment["spec"]["template"]["metadata"]["labels"].items()
    )


@pytest.mark.parametrize("enabled", [True, False])
def test_etcd_network_policy_admits_only_its_own_namespace(enabled: bool, tmp_path: Path) -> None:
    values = {"etcd": {"enabled": True, "networkPolicy": enabled}, "workloadNamespace": "jobs"}
    manifests = render(values, tmp_path)
    if not enabled:
        assert not [
            m for m in find(manifests, "NetworkPolicy") if m["metadata"]["name"] == "etcd-server"
        ]
        return
    policy = one(manifests, "NetworkPolicy", "etcd-server")
    assert policy["metadata"]["namespace"] == "jobs"
    etcd_pod_labels = one(manifests, "Deployment", "etcd-server")["spec"]["template"]["metadata"][
        "labels"
    ]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= etcd_pod_labels.items()
    assert policy["spec"]["ingress"] == [
        {"from": [{"podSelector": {}}], "ports": [{"port": "client", "protocol": "TCP"}]}
    ]


def test_fsx_storage_class_and_claim_have_the_tutorials_settings(tmp_path: Path) -> None:
    manifests = render({**SWITCHES["fsx"], "workloadNamespace": "default"}, tmp_path)
    storage_class = one(manifests, "StorageClass", "fsx-sc")
    assert storage_class["provisioner"] == "fsx.csi.aws.com"
    assert storage_class["mountOptions"] == ["flock"]
    assert storage_class["parameters"] == {
        "subnetId": "subnet-0a1b2c3d",
        "securityGroupIds": "sg-0123abcd",
        "deploymentType": "PERSISTENT_1",
        "perUnitStorageThroughput": "200",
        "automaticBackupRetentionDays": "1",
        "fileSystemTypeVersion": "2.12",
        "dataCompressionType": "NONE",
    }
    claim = one(manifests, "PersistentVolumeClaim", "fsx-claim")
    assert claim["metadata"]["namespace"] == "default"
    assert claim["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["storageClassName"] == "fsx-sc"
    assert claim["spec"]["resources"] == {"requests": {"storage": "1200Gi"}}


def test_scratch_file_systems_get_no_persistent_only_parameters(tmp_path: Path) -> None:
    fsx = {**FSX_ON, "storageClass": {**FSX_ON["storageClass"], "deploymentType": "SCRATCH_2"}}
    storage_class = one(render({"fsx": fsx}, tmp_path), "StorageClass")
    assert storage_class["parameters"]["deploymentType"] == "SCRATCH_2"
    assert "perUnitStorageThroughput" not in storage_class["parameters"]
    assert "automaticBackupRetentionDays" not in storage_class["parameters"]


def test_fsx_claim_can_use_an_existing_storage_class(tmp_path: Path) -> None:
    values = {"fsx": {"enabled": True, "storageClass": {"create": False, "name": "lustre"}}}
    manifests = render(values, tmp_path)
    assert not find(manifests, "StorageClass")
    assert one(manifests, "PersistentVolumeClaim")["spec"]["storageClassName"] == "lustre"


def _daemonset_pod(manifests: list[Manifest], component: str) -> dict[str, Any]:
    (daemonset,) = [
        m
        for m in find(manifests, "DaemonSet")
        if m["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    assert daemonset["metadata"]["namespace"] == "kube-system"
    pod: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return pod


def _affinity_instance_types(pod: dict[str, Any]) -> list[str]:
    (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == "node.kubernetes.io/instance-type"
    assert expression["operator"] == "In"
    values: list[str] = expression["values"]
    return values


def test_neuron_device_plugin_runs_on_neuron_nodes_only(tmp_path: Path) -> None:
    manifests = render(SWITCHES["neuron-device-plugin"], tmp_path)
    pod = _daemonset_pod(manifests, "neuron-device-plugin")
    (container,) = pod["containers"]
    assert container["image"] == "public.ecr.aws/neuron/neuron-device-plugin:2.28.27.0"
    assert set(INSTANCE_TYPES) <= set(_affinity_instance_types(pod)), "every Trainium type"
    assert {"key": "aws.amazon.com/neuron", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["priorityClassName"] == "system-node-critical"
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/var/lib/kubelet/device-plugins" in mounts
    binding = one(manifests, "ClusterRoleBinding", f"{FULLNAME}-neuron-device-plugin")
    assert binding["subjects"][0]["name"] == pod["serviceAccountName"]


def test_efa_device_plugin_runs_on_efa_trainium_nodes_only(tmp_path: Path) -> None:
    pod = _daemonset_pod(render(SWITCHES["efa-device-plugin"], tmp_path), "efa-device-plugin")
    (container,) = pod["containers"]
    assert container["image"].endswith("/eks/aws-efa-k8s-device-plugin:v0.5.5")
    assert _affinity_instance_types(pod) == [
        "trn1.32xlarge",
        "trn1n.32xlarge",
        "trn2.48xlarge",
        "trn2u.48xlarge",
    ]
    efa_types = {t.name for t in INSTANCE_TYPES.values() if t.efa_interfaces}
    assert set(_affinity_instance_types(pod)) == efa_types, "the operator's instance table"
    assert {"key": "aws.amazon.com/efa", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["hostNetwork"] is True
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {"/var/lib/kubelet/device-plugins", "/dev/infiniband"} <= mounts


def test_profile_ui_mounts_the_shared_claim_read_only(tmp_path: Path) -> None:
    values = {**SWITCHES["profile-ui"], "workloadNamespace": "default"}
    manifests = render(values, tmp_path)
    deployment = one(manifests, "Deployment", f"{FULLNAME}-profile-ui")
    assert deployment["metadata"]["namespace"] == "default"
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["trainium-operator"]
    assert container["args"] == [
        "profile",
        "serve",
        "/data/profiles",
        "--port=8090",
        "--host=0.0.0.0",
        "--auth=kubernetes",
        f"--allowed-host={FULLNAME}-profile-ui",
        f"--allowed-host={FULLNAME}-profile-ui.default",
        f"--allowed-host={FULLNAME}-profile-ui.default.svc",
        f"--allowed-host={FULLNAME}-profile-ui.default.svc.cluster.local",
        "--allowed-host=localhost",
        "--allowed-host=127.0.0.1",
        "--summary-cache=/summaries",
        "--summary-cache-size=1536",
        "--memory-budget=512",
        "--summarise-ahead=16",
        "--summarise-written-every=15",
        "--list-jobs",
    ]
    assert {"name": "shared", "mountPath": "/data", "readOnly": True} in container["volumeMounts"]
    # The UI's summaries live in a volume of its own, never on the tenant-writable claim.
    assert {"name": "summaries", "mountPath": "/summaries"} in container["volumeMounts"]
    (summaries,) = [v for v in pod["volumes"] if v["name"] == "summaries"]
    assert summaries["emptyDir"] == {"sizeLimit": "2Gi"}
    (shared,) = [v for v in pod["volumes"] if v["name"] == "shared"]
    assert shared["persistentVolumeClaim"] == {"claimName": "fsx-claim", "readOnly": True}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    service = one(manifests, "Service", f"{FULLNAME}-profile-ui")
    assert service["spec"]["ports"][0]["port"] == 8090


def test_profile_upload_default_and_its_irsa_service_account(tmp_path: Path) -> None:
    values = {**SWITCHES["profile-upload"], "workloadNamespace": "jobs"}
    manifests = render(values, tmp_path)
    env = {e["name"]: e.get("value") for e in operator_container(manifests)["env"]}
    assert env[ENV_PROFILE_S3_URI] == "s3://my-profiles/trainium", "the name the operator reads"
    assert env[ENV_PROFILE_UPLOAD_SERVICE_ACCOUNT] == f"{FULLNAME}-profile-upload"
    account = one(manifests, "ServiceAccount", f"{FULLNAME}-profile-upload")
    assert account["metadata"]["namespace"] == "jobs"
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/p"
    }
    defaults = {e["name"] for e in operator_container(render({}, tmp_path))["env"]}
    assert "TRAINIUM_PROFILE_S3_URI" not in defaults


def test_profile_ui_can_serve_an_s3_prefix_with_a_local_cache(tmp_path: Path) -> None:
    role = {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/ui"}
    values = {
        "profileUI": {
            "enabled": True,
            "s3Uri": "s3://my-profiles/trainium",
            "serviceAccountAnnotations": role,
        }
    }
    manifests = render(values, tmp_path)
    deployment = one(manifests, "Deployment", f"{FULLNAME}-profile-ui")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"][2] == "s3://my-profiles/trainium"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TRAINIUM_PROFILE_CACHE"] == "/cache"
    assert {v["name"] for v in pod["volumes"]} == {"cache", "summaries", "tmp"}, "no claim needed"
    account = one(manifests, "ServiceAccount", f"{FULLNAME}-profile-ui")
    assert account["metadata"]["annotations"] == role


def test_profile_ui_summarising_of_written_profiles_can_be_sized_or_turned_off(
    tmp_path: Path,
) -> None:
    values = {"profileUI": {"enabled": True, "summariseAhead": 4, "summariseWrittenSeconds": 0}}
    deployment = one(render(values, tmp_path), "Deployment", f"{FULLNAME}-profile-ui")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert "--summarise-ahead=4" in container["args"]
    assert "--summarise-written-every=0" in container["args"]


def test_profile_ui_lists_only_the_watched_namespaces_when_its_rbac_is_per_namespace(
    tmp_path: Path,
) -> None:
    values = {**SWITCHES["profile-ui"], "watchNamespaces": ["team-a", "team-b"]}
    deployment = one(render(values, tmp_path), "Deployment", f"{FULLNAME}-profile-ui")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"][-3:] == ["--list-jobs", "--namespace=team-a", "--namespace=team-b"]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({"workloadNamespace": ""}, RELEASE_NAMESPACE, id="release-namespace"),
        pytest.param({"workloadNamespace": "jobs"}, "jobs", id="explicit"),
    ],
)
def test_workload_add_ons_go_to_the_workload_namespace(
    values: dict[str, Any], expected: str, tmp_path: Path
) -> None:
    manifests = render({**values, **SWITCHES["etcd"], "fsx": FSX_ON}, tmp_path)
    for kind, name in [
        ("Deployment", "etcd-server"),
        ("Service", "etcd-server"),
        ("PersistentVolumeClaim", "fsx-claim"),
    ]:
        assert one(manifests, kind, name)["metadata"]["namespace"] == expected
    # The operator itself always stays in the release namespace.
    assert one(manifests, "Deployment", FULLNAME)["metadata"]["namespace"] == RELEASE_NAMESPACE


@pytest.mark.parametrize(
    ("flag", "offending_key"),
    [
        pytest.param("resouces.limits.cpu=1", "resouces", id="top-level"),
        pytest.param("image.tagg=1.0", "tagg", id="image"),
        pytest.param("fsx.storageClass.deploymentTyp=SCRATCH_2", "deploymentTyp", id="fsx"),
        pytest.param(
            "securityContext.readOnlyRootFileSystem=false",
            "readOnlyRootFileSystem",
            id="k8s-object",
        ),
        pytest.param("tolerations[0].efect=NoSchedule", "efect", id="k8s-list-item"),
        pytest.param("profileUI.enable=true", "enable", id="switch"),
    ],
)
def test_a_misspelled_value_is_refused_naming_the_key(
    flag: str, offending_key: str, tmp_path: Path
) -> None:
    result = helm(*template_args({}, tmp_path), "--set", flag, check=False)
    assert result.returncode != 0
    assert "schema" in result.stderr
    assert offending_key in result.stderr


@pytest.mark.parametrize(
    "flag",
    [
        pytest.param("operator.logFormat=xml", id="enum"),
        pytest.param("image.tag=latest", id="latest-tag"),
        pytest.param("metrics.port=70000", id="port-range"),
        pytest.param("watchNamespaces[0]=Not_A_Namespace", id="namespace-name"),
        pytest.param("fsx.enabled=true", id="fsx-without-subnet"),
        pytest.param("profileUpload.s3Uri=my-bucket/profiles", id="s3-uri-without-scheme"),
        pytest.param("profileUI.summariseWrittenSeconds=-1", id="negative-interval"),
        pytest.param("profileUI.summariseAhead=-1", id="negative-queue"),
    ],
)
def test_an_invalid_value_is_refused_by_the_schema(flag: str, tmp_path: Path) -> None:
    result = helm(*template_args({}, tmp_path), "--set", flag, check=False)
    assert result.returncode != 0
    assert "schema" in result.stderr


def render_notes(values: dict[str, Any], tmp_path: Path) -> str:
    """NOTES.txt as `helm install` prints it. helm 3 renders NOTES only when it can reach a
    cluster, so a copy of the chart renders the same template text into a ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes_under_test.tpl").write_text(
        '{{- define "notes-under-test" -}}\n' + notes + "{{- end }}\n"
    )
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ include "notes-under-test" . | quote }}\n'
    )
    output = helm(
        "template",
        "trn",
        str(chart),
        "--namespace",
        RELEASE_NAMESPACE,
        "--values",
        str(values_file(values, tmp_path)),
        "--show-only",
        "templates/notes-under-test.yaml",
    ).stdout
    text: str = yaml.safe_load(output)["data"]["notes"]
    return text


def test_install_notes_tell_the_next_step(tmp_path: Path) -> None:
    notes = render_notes({"workloadNamespace": "default"}, tmp_path)
    assert f"kubectl -n {RELEASE_NAMESPACE} rollout status deployment/{FULLNAME}" in notes
    assert "kubectl apply -n default -f examples/bert-large-pretrain.yaml" in notes
    assert "kubectl get trainingjobs -n default -w" in notes
    assert "this release installs no device plugins" in notes
    assert "port-forward" not in notes
    assert "Kueue" not in notes


def test_install_notes_follow_the_enabled_add_ons(tmp_path: Path) -> None:
    notes = render_notes({**EVERYTHING, "workloadNamespace": "default"}, tmp_path)
    assert "kubectl -n default get pvc fsx-claim -w" in notes
    assert 'queue "test" created' in notes
    assert "endpoint: etcd-server:2379" in notes
    assert 'LocalQueue "trainium" created in default' in notes
    assert "kubectl get localqueues -n default" in notes
    assert f"port-forward service/{FULLNAME}-profile-ui 8090:8090" in notes
    assert "this release installs no device plugins" not in notes


def _pod_labels(manifests: list[Manifest], deployment: str) -> dict[str, str]:
    labels: dict[str, str] = one(manifests, "Deployment", deployment)["spec"]["template"][
        "metadata"
    ]["labels"]
    return labels


def test_operator_and_ui_network_policies_admit_only_their_own_ports(tmp_path: Path) -> None:
    metrics_peer = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    values = {
        "profileUI": {"enabled": True},
        "networkPolicy": {"metricsFrom": [metrics_peer]},
        "workloadNamespace": "jobs",
    }
    manifests = render(values, tmp_path)
    operator = one(manifests, "NetworkPolicy", FULLNAME)
    assert operator["metadata"]["namespace"] == RELEASE_NAMESPACE
    selector = operator["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= _pod_labels(manifests, FULLNAME).items()
    assert operator["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"] for p in operator_container(manifests)["ports"]}
    rule, channel = operator["spec"]["ingress"]
    assert {p["port"] for p in rule["ports"]} == {"health", "metrics"}
    assert rule["from"] == [metrics_peer]
    assert [p["port"] for p in channel["ports"]] == ["health-channel"]
    assert channel["from"] == [
        {
            "namespaceSelector": {},
            "podSelector": {"matchExpressions": [{"key": LABEL_JOB_NAME, "operator": "Exists"}]},
        }
    ], "only TrainingJob pods reach the health channel"
    assert ports == {"health", "metrics", "health-channel"}, "every port it serves, no more"
    ui_name = f"{FULLNAME}-profile-ui"
    ui = one(manifests, "NetworkPolicy", ui_name)
    assert ui["metadata"]["namespace"] == "jobs"
    assert (
        ui["spec"]["podSelector"]["matchLabels"].items() <= _pod_labels(manifests, ui_name).items()
    )
    assert (
        not ui["spec"]["podSelector"]["matchLabels"].items()
        <= _pod_labels(manifests, FULLNAME).items()
    )
    assert ui["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]


def test_network_policies_and_per_job_isolation_can_be_turned_off(tmp_path: Path) -> None:
    on = render({}, tmp_path)
    env = {e["name"]: e.get("value") for e in operator_container(on)["env"]}
    assert env[ENV_JOB_NETWORK_POLICY] == "true"
    off = render({"networkPolicy": {"enabled": False, "jobs": False}}, tmp_path)
    assert not find(off, "NetworkPolicy")
    env = {e["name"]: e.get("value") for e in operator_container(off)["env"]}
    assert env[ENV_JOB_NETWORK_POLICY] == "false", "the name and value the operator reads"

"""The dev cluster's Kueue without a cluster: its configuration, argv, webhook and CRD rewrites,
the queues built from node capacity, the CA and certificates, and the finalizer clean-up."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cryptography import x509

from trainium_devcluster import build, kueue, objects, paths, versions

BASE = "https://127.0.0.1:9443"


def _webhook(name: str, path: str, group: str, resources: list[str]) -> dict[str, Any]:
    return {
        "admissionReviewVersions": ["v1"],
        "clientConfig": {
            "service": {"name": "webhook-service", "namespace": "system", "path": path}
        },
        "failurePolicy": "Fail",
        "name": name,
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": resources,
            }
        ],
        "sideEffects": "None",
    }


# The shape of Kueue's config/components/webhook/manifests.yaml, a few entries of each kind.
MANIFESTS = [
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "mutating-webhook-configuration"},
        "webhooks": [
            _webhook("mjob.kb.io", "/mutate-batch-v1-job", "batch", ["jobs"]),
            _webhook("mpod.kb.io", "/mutate--v1-pod", "", ["pods"]),
            _webhook(
                "mclusterqueue.kb.io",
                "/mutate-kueue-x-k8s-io-v1beta2-clusterqueue",
                "kueue.x-k8s.io",
                ["clusterqueues"],
            ),
        ],
    },
    {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "validating-webhook-configuration"},
        "webhooks": [
            _webhook("vdeployment.kb.io", "/validate-apps-v1-deployment", "apps", ["deployments"]),
            _webhook("vpod.kb.io", "/validate--v1-pod", "", ["pods"]),
            _webhook(
                "vworkload.kb.io",
                "/validate-kueue-x-k8s-io-v1beta2-workload",
                "kueue.x-k8s.io",
                ["workloads", "workloads/status"],
            ),
        ],
    },
]


def test_configuration_manages_only_labelled_pods_and_serves_everything_on_loopback(
    tmp_path: Path,
) -> None:
    config = kueue.configuration(webhook_port=1, cert_dir=tmp_path, health_port=2, metrics_port=3)
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["kind"] == "Configuration"
    assert config["integrations"] == {"frameworks": ["pod"]}
    assert config["manageJobsWithoutQueueName"] is False
    assert config["internalCertManagement"] == {"enable": False}
    assert config["leaderElection"] == {"leaderElect": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 1, "certDir": str(tmp_path)}
    assert config["health"] == {"healthProbeBindAddress": "127.0.0.1:2"}
    assert config["metrics"] == {"bindAddress": "127.0.0.1:3"}
    assert config["featureGates"] == {"VisibilityOnDemand": False}


def test_configuration_waits_for_whole_gangs_ready_with_a_bounded_requeue_backoff(
    tmp_path: Path,
) -> None:
    config = kueue.configuration(webhook_port=1, cert_dir=tmp_path, health_port=2, metrics_port=3)
    wait = config["waitForPodsReady"]
    assert wait["blockAdmission"] is True
    assert wait["timeout"] == "5m"
    backoff = wait["requeuingStrategy"]
    assert backoff["backoffMaxSeconds"] >= backoff["backoffBaseSeconds"] > 0
    assert "backoffLimitCount" not in backoff, "requeued, never deactivated by the queue"


def test_manager_argv_names_the_configuration_and_the_clusters_kubeconfig() -> None:
    argv = kueue.manager_argv(Path("/b/kueue"), Path("/k/kc.yaml"), Path("/s/kueue-config.yaml"))
    assert argv[0] == "/b/kueue"
    assert {"--config=/s/kueue-config.yaml", "--kubeconfig=/k/kc.yaml"} <= set(argv)


def test_webhooks_call_loopback_with_the_ca_and_keep_kueues_failure_policy() -> None:
    configs = kueue.webhook_configurations(MANIFESTS, base_url=BASE, ca_bundle="Q0E=")
    assert [c["metadata"]["name"] for c in configs] == [
        "kueue-mutating-webhook-configuration",
        "kueue-validating-webhook-configuration",
    ]
    for config in configs:
        for webhook in config["webhooks"]:
            assert webhook["clientConfig"]["caBundle"] == "Q0E="
            assert webhook["clientConfig"]["url"].startswith(f"{BASE}/")
            assert webhook["failurePolicy"] == "Fail"
    assert configs[0]["webhooks"][0]["clientConfig"]["url"] == f"{BASE}/mutate--v1-pod"


def test_only_kueues_own_kinds_and_pods_keep_a_webhook() -> None:
    configs = kueue.webhook_configurations(MANIFESTS, base_url=BASE, ca_bundle="x")
    names = [[w["name"] for w in c["webhooks"]] for c in configs]
    assert names == [["mpod.kb.io", "mclusterqueue.kb.io"], ["vpod.kb.io", "vworkload.kb.io"]]


def test_only_pods_naming_a_local_queue_are_sent_to_kueue() -> None:
    configs = kueue.webhook_configurations(MANIFESTS, base_url=BASE, ca_bundle="x")
    webhooks = {w["name"]: w for c in configs for w in c["webhooks"]}
    for name in ("mpod.kb.io", "vpod.kb.io"):
        assert webhooks[name]["objectSelector"] == {
            "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]
        }
        (excluded,) = webhooks[name]["namespaceSelector"]["matchExpressions"]
        assert excluded["operator"] == "NotIn"
        assert set(excluded["values"]) == {"kube-system", "kueue-system"}
    assert "objectSelector" not in webhooks["vworkload.kb.io"]
    assert "service" in MANIFESTS[0]["webhooks"][1]["clientConfig"], "the input is not changed"


def _crd(plural: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{plural}.kueue.x-k8s.io"}, "spec": {"names": {"plural": plural}}}


def test_crds_kueue_converts_get_its_conversion_webhook_by_url() -> None:
    workloads = kueue.with_conversion_webhook(_crd("workloads"), base_url=BASE, ca_bundle="x")
    assert workloads["spec"]["conversion"] == {
        "strategy": "Webhook",
        "webhook": {
            "clientConfig": {"url": f"{BASE}/convert", "caBundle": "x"},
            "conversionReviewVersions": ["v1"],
        },
    }
    flavors = _crd("resourceflavors")
    assert kueue.with_conversion_webhook(flavors, base_url=BASE, ca_bundle="x") == flavors


def test_quota_per_instance_type_is_the_sum_of_its_nodes_allocatable() -> None:
    nodes = objects.fake_nodes(2, "trn1.32xlarge") + objects.fake_nodes(1, "trn1.2xlarge")
    gone = objects.fake_nodes(1, "trn1.32xlarge", first_index=5)[0]
    gone["metadata"]["deletionTimestamp"] = "2026-12-05T00:00:00Z"
    unlabelled = {"metadata": {"name": "other"}, "status": {"allocatable": {"cpu": "4"}}}
    quota = kueue.node_quota([*nodes, gone, unlabelled])
    assert sorted(quota) == ["trn1.2xlarge", "trn1.32xlarge"]
    big = quota["trn1.32xlarge"]
    assert big["cpu"] == "256"
    assert big["memory"] == "1Ti"
    assert big["aws.amazon.com/neuron"] == "32"
    assert big["aws.amazon.com/neuroncore"] == "64"
    assert big["vpc.amazonaws.com/efa"] == "16"
    assert "vpc.amazonaws.com/efa" not in quota["trn1.2xlarge"]


def test_cluster_queue_has_a_flavor_per_type_covering_every_resource_and_preempts_by_priority() -> (
    None
):
    nodes = objects.fake_nodes(1, "trn1.32xlarge") + objects.fake_nodes(1, "trn1.2xlarge")
    queue = kueue.cluster_queue(kueue.node_quota(nodes))
    assert queue["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert queue["metadata"] == {"name": "trainium"}
    spec = queue["spec"]
    assert spec["namespaceSelector"] == {}
    assert spec["preemption"] == {"withinClusterQueue": "LowerPriority"}
    (group,) = spec["resourceGroups"]
    assert {"cpu", "memory", "aws.amazon.com/neuron", "vpc.amazonaws.com/efa"} <= set(
        group["coveredResources"]
    )
    assert [f["name"] for f in group["flavors"]] == ["trn1-2xlarge", "trn1-32xlarge"]
    for flavor in group["flavors"]:
        assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
    small = {r["name"]: r["nominalQuota"] for r in group["flavors"][0]["resources"]}
    assert small["vpc.amazonaws.com/efa"] == "0"


def test_flavors_select_their_instance_type_and_queues_point_at_trainium() -> None:
    flavor = kueue.resource_flavor("trn2.48xlarge")
    assert flavor["metadata"] == {"name": "trn2-48xlarge"}
    assert flavor["spec"] == {"nodeLabels": {"node.kubernetes.io/instance-type": "trn2.48xlarge"}}
    queue = kueue.local_queue("team-a")
    assert queue["metadata"] == {"name": "trainium", "namespace": "team-a"}
    assert queue["spec"] == {"clusterQueue": "trainium"}
    assert kueue.workload_priority_class("high", 1000)["value"] == 1000
    assert kueue.PRIORITY_CLASSES == {"low": 100, "high": 1000}


def test_serving_certificate_is_for_127_0_0_1_and_signed_by_the_clusters_ca() -> None:
    now = datetime.datetime(2026, 12, 5, tzinfo=datetime.UTC)
    ca_pem, ca_key = kueue.issue_certificates("ca", now=now)
    cert_pem, _ = kueue.issue_certificates("127.0.0.1", now=now, issuer=(ca_pem, ca_key))
    ca, cert = x509.load_pem_x509_certificate(ca_pem), x509.load_pem_x509_certificate(cert_pem)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    cert.verify_directly_issued_by(ca)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert cert.not_valid_before_utc < now < cert.not_valid_after_utc


def test_the_clusters_ca_is_made_once_so_its_bundle_stays_valid(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(paths.CACHE_DIR_ENV, str(tmp_path))
    cluster = paths.ClusterPaths("unit")
    first = kueue.ensure_certificates(cluster)
    bundle = kueue.ca_bundle(first)
    again = kueue.ensure_certificates(cluster)
    assert kueue.ca_bundle(again) == bundle
    assert first.directory == cluster.state_dir / "kueue-certs"
    assert {p.name for p in first.directory.iterdir()} == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert oct(first.ca_key.stat().st_mode & 0o777) == "0o600"


def test_a_metrics_certificate_that_cannot_be_written_names_the_path(tmp_path: Path) -> None:
    kueue.ensure_metrics_certificate(tmp_path / "certs")
    assert (tmp_path / "certs" / "tls.crt").is_file()
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(kueue.KueueError, match=str(blocker / "certs")):
        kueue.ensure_metrics_certificate(blocker / "certs")


class _RecordingCore:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str, list[dict[str, Any]]]] = []

    def patch_namespaced_pod(self, name: str, namespace: str, body: list[dict[str, Any]]) -> None:
        self.patches.append((name, namespace, body))


def _pod(name: str, *finalizers: str) -> Any:
    return SimpleNamespace(metadata=SimpleNamespace(name=name, finalizers=list(finalizers) or None))


def test_only_kueues_finalizer_is_stripped_and_only_where_it_still_is() -> None:
    core = _RecordingCore()
    pods = [_pod("a", "x/hold", kueue.MANAGED_FINALIZER), _pod("b", "x/hold"), _pod("c")]
    assert kueue.strip_finalizers(core, "ns", pods) == ["a"]
    ((name, namespace, patch),) = core.patches
    assert (name, namespace) == ("a", "ns")
    assert patch == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": kueue.MANAGED_FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]


def test_kueue_is_one_pinned_component_whose_manifests_share_its_cache_key() -> None:
    component = versions.GO_COMPONENTS["kueue"]
    assert component.version == "v0.19.2"
    assert [b.name for b in component.binaries] == ["kueue"]
    assert component.binaries[0].package == "sigs.k8s.io/kueue/cmd/kueue"
    assert ("sigs.k8s.io/kueue/pkg/version.GitVersion", "v0.19.2") in component.ldflags_x
    assert build.kueue_manifest_dir().name == build.component_dir(component).name
    go_mod = (build.wrapper_dir(component) / "go.mod").read_text()
    assert "sigs.k8s.io/kueue v0.19.2" in go_mod
    assert build.expected_toolchain().kueue_manifest_dir == build.kueue_manifest_dir()

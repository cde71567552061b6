"""`helm install` into the real local cluster, then the operator running with only the chart's
RBAC (a ServiceAccount token, no admin rights): the tutorial flow works, and a removed rule
fails loudly and precisely instead of silently."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from integration.health_ranks import (
    outcome,
    rank_env,
    reporting_job,
    start_rank,
)
from integration.operator_harness import (
    ROOT,
    OperatorProcess,
    create_job,
    ensure_shared_claim,
    finish_pods,
    free_port,
    install_crds,
    job_events,
    job_manifest,
    job_pods,
    wait_gang_running,
    wait_phase,
)
from integration.tenancy_harness import label_pod_security
from trainium_devcluster.access import service_account_kubeconfig
from trainium_devcluster.sim import wait_for

pytestmark = pytest.mark.integration
CHART = ROOT / "charts" / "trainium-operator"


def helm(dev_cluster: Any, *args: str) -> str:
    result = subprocess.run(
        ["helm", *args],
        capture_output=True,
        text=True,
        env=dev_cluster.tool_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def release(dev_cluster: Any, namespace: str, tmp_path: Path) -> Iterator[str]:
    """The chart installed in the test namespace, watching only that namespace."""
    install_crds(dev_cluster.clients)
    name = f"t{uuid.uuid4().hex[:6]}"
    values = tmp_path / "values.yaml"
    # One namespace for the release and its jobs: the tenancy policy would refuse jobs beside
    # the operator (tests/integration/test_tenancy.py shows that).
    values.write_text(
        yaml.safe_dump(
            {"watchNamespaces": [namespace], "tenancy": {"allowJobsInReleaseNamespace": True}}
        )
    )
    label_pod_security(dev_cluster, namespace, "baseline")  # where the policy takes jobs
    helm(dev_cluster, "install", name, str(CHART), "-n", namespace, "-f", str(values))
    yield name
    helm(dev_cluster, "uninstall", name, "-n", namespace)


def _operator_as_chart_account(
    dev_cluster: Any, namespace: str, release: str, tmp_path: Path
) -> OperatorProcess:
    account = f"{release}-trainium-operator"
    kubeconfig = service_account_kubeconfig(
        dev_cluster.clients,
        Path(dev_cluster.kubeconfig),
        namespace=namespace,
        service_account=account,
        output=tmp_path / "operator-kubeconfig.yaml",
    )
    ensure_shared_claim(dev_cluster.clients, namespace)
    return OperatorProcess(kubeconfig, namespace, tmp_path / "operator.log")


def test_helm_install_creates_the_operator_deployment_and_least_privilege_rbac(
    dev_cluster: Any, namespace: str, release: str
) -> None:
    apps = dev_cluster.clients.apps
    deployment = apps.read_namespaced_deployment(f"{release}-trainium-operator", namespace)
    pod_spec = deployment.spec.template.spec
    container = pod_spec.containers[0]
    assert container.command == ["trainium-operator"]
    assert container.args[0] == "run"
    assert f"--namespace={namespace}" in container.args
    assert pod_spec.security_context.run_as_non_root is True
    assert container.security_context.read_only_root_filesystem is True
    assert container.security_context.capabilities.drop == ["ALL"]
    rbac = dev_cluster.clients.api_client
    from kubernetes import client

    role = client.RbacAuthorizationV1Api(rbac).read_namespaced_role(
        f"{release}-trainium-operator", namespace
    )
    granted = {(r.resources[0], verb) for r in role.rules for verb in r.verbs}
    assert ("pods", "create") in granted
    assert ("trainingjobs/status", "update") in granted
    assert not any("*" in r.verbs or "*" in r.resources for r in role.rules)
    assert not any("secrets" in r.resources for r in role.rules)


def test_operator_with_only_the_charts_rbac_runs_the_job_to_success(
    dev_cluster: Any, namespace: str, release: str, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    operator = _operator_as_chart_account(dev_cluster, namespace, release, tmp_path)
    operator.start()
    try:
        create_job(clients, namespace, job_manifest("rbac"))
        finish_pods(clients, namespace, wait_gang_running(clients, namespace, "rbac", "compile", 0))
        finish_pods(clients, namespace, wait_gang_running(clients, namespace, "rbac", "train", 0))
        wait_phase(clients, namespace, "rbac", "Succeeded")
        operator.assert_alive()
    finally:
        operator.stop()
    assert "Traceback" not in operator.log()
    assert "forbidden" not in operator.log().lower()


def test_the_charts_account_reviews_a_ranks_pod_bound_token_and_accepts_its_progress(
    dev_cluster: Any, namespace: str, release: str, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    operator = _operator_as_chart_account(dev_cluster, namespace, release, tmp_path)
    port = free_port()
    operator.extra_args = ("--health-port", str(port))
    operator.start()
    try:
        pod, token = reporting_job(clients, namespace, "beat", tmp_path)
        result = outcome(start_rank(rank_env(pod, token, 0, 1), 10, 0.1))
        operator.assert_alive()
    finally:
        operator.stop()
    assert result["sent"] >= 2, result  # TokenReview allowed by the chart's ClusterRole
    assert "forbidden" not in operator.log().lower()


def test_a_removed_rbac_rule_is_reported_precisely_and_nothing_is_created(
    dev_cluster: Any, namespace: str, release: str, tmp_path: Path
) -> None:
    from kubernetes import client

    clients = dev_cluster.clients
    rbac = client.RbacAuthorizationV1Api(clients.api_client)
    role_name = f"{release}-trainium-operator"
    role = rbac.read_namespaced_role(role_name, namespace)
    for rule in role.rules:
        if rule.resources == ["pods"]:
            rule.verbs = [v for v in rule.verbs if v != "create"]
    rbac.replace_namespaced_role(role_name, namespace, role)

    operator = _operator_as_chart_account(dev_cluster, namespace, release, tmp_path)
    operator.start()
    try:
        create_job(clients, namespace, job_manifest("norbac"))
        events = wait_for(
            lambda: [
                message
                for kind, reason, message in job_events(clients, namespace, "norbac")
                if kind == "Warning" and reason == "PermissionDenied"
            ],
            timeout=60,
            description="a PermissionDenied warning on the job",
        )
        assert 'cannot create resource "pods"' in events[0]
        assert "templates/_rbac.tpl" in events[0]
        assert job_pods(clients, namespace, "norbac") == []
        operator.assert_alive()
    finally:
        operator.stop()
    log = operator.log()
    assert "permission denied" in log
    assert "Traceback" not in log


def test_profile_ui_account_lists_every_job_of_its_namespace_and_cannot_write(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    """The chart's profile UI, authenticated as its own ServiceAccount, lists the namespace's
    TrainingJobs (all of them, profiled or not); it may not list other namespaces nor change
    anything."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from trainium_operator.k8s.client import load_api_client
    from trainium_operator.ui.jobs import cluster_job_lister

    install_crds(dev_cluster.clients)
    name = f"u{uuid.uuid4().hex[:6]}"
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "watchNamespaces": [namespace],
                "workloadNamespace": namespace,
                "tenancy": {"allowJobsInReleaseNamespace": True},
                "profileUI": {"enabled": True},
            }
        )
    )
    label_pod_security(dev_cluster, namespace, "baseline")  # where the policy takes jobs
    helm(dev_cluster, "install", name, str(CHART), "-n", namespace, "-f", str(values))
    try:
        clients = dev_cluster.clients
        profiled = job_manifest("profiled")
        profiled["spec"]["profile"] = {"enabled": True}
        create_job(clients, namespace, profiled)
        create_job(clients, namespace, job_manifest("unprofiled"))
        kubeconfig = service_account_kubeconfig(
            clients,
            Path(dev_cluster.kubeconfig),
            namespace=namespace,
            service_account=f"{name}-trainium-operator-profile-ui",
            output=tmp_path / "ui-kubeconfig.yaml",
        )

        jobs = asyncio.run(cluster_job_lister(str(kubeconfig), [namespace])())

        listed = {job.name: job for job in jobs}
        assert sorted(listed) == ["profiled", "unprofiled"]
        assert {job.namespace for job in jobs} == {namespace}
        assert (listed["profiled"].profiling, listed["unprofiled"].profiling) == (True, False)
        assert listed["profiled"].created.endswith("Z")
        assert listed["profiled"].status in {"Pending", "Compiling"}
        with pytest.raises(ApiException) as cluster_wide:
            asyncio.run(cluster_job_lister(str(kubeconfig))())
        assert cluster_wide.value.status == 403
        custom = client.CustomObjectsApi(load_api_client(str(kubeconfig)))
        with pytest.raises(ApiException) as write:
            custom.delete_namespaced_custom_object(
                "trainium.dev", "v1alpha1", namespace, "trainingjobs", "profiled"
            )
        assert write.value.status == 403
    finally:
        helm(dev_cluster, "uninstall", name, "-n", namespace)

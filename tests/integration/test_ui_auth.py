"""The profile UI's `--auth kubernetes` against the real kube-apiserver of the dev cluster.

The chart is installed (its UI ServiceAccount holds exactly the chart's UI RBAC), the UI app
runs in-process as that account, and a user is a ServiceAccount whose Role may read the
TrainingJobs of namespace A only, calling with its own token (TokenRequest API). Every
answer below is the real API server's TokenReview and SubjectAccessReview.
"""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client

from integration.operator_harness import ROOT, create_job, install_crds, job_manifest
from integration.tenancy_harness import label_pod_security
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_devcluster import testing
from trainium_devcluster.access import service_account_kubeconfig
from trainium_operator.ui.app import create_app
from trainium_operator.ui.auth import kubernetes_access
from trainium_operator.ui.guards import CSRF_HEADER
from trainium_operator.ui.jobs import cluster_job_lister

pytestmark = pytest.mark.integration
CHART = ROOT / "charts" / "trainium-operator"
TINY = SyntheticSpec(nodes=1, ranks_per_node=1, steps=3, detailed_steps=(1, 2), kernels_per_step=2)
VIEWER = "viewer"


def helm(dev_cluster: Any, *args: str) -> None:
    result = subprocess.run(
        ["helm", *args], capture_output=True, text=True, env=dev_cluster.tool_env(), check=False
    )
    assert result.returncode == 0, result.stderr


@dataclass(frozen=True)
class Tenants:
    team_a: str
    team_b: str
    ui_kubeconfig: Path
    viewer_token: str
    profiles: Path


@pytest.fixture
def tenants(dev_cluster: Any, tmp_path: Path) -> Iterator[Tenants]:
    install_crds(dev_cluster.clients)
    with (
        testing.fresh_namespace(dev_cluster) as team_a,
        testing.fresh_namespace(dev_cluster) as team_b,
        # The release lives in a namespace of its own: the tenancy policy refuses TrainingJobs
        # beside the operator's ServiceAccount.
        testing.fresh_namespace(dev_cluster) as home,
    ):
        for team in (team_a, team_b):
            label_pod_security(dev_cluster, team, "baseline")
        release = f"u{uuid.uuid4().hex[:6]}"
        values = tmp_path / "values.yaml"
        values.write_text(
            yaml.safe_dump(
                {
                    "watchNamespaces": [team_a, team_b],
                    "workloadNamespace": team_a,
                    "profileUI": {"enabled": True},
                }
            )
        )
        helm(dev_cluster, "install", release, str(CHART), "-n", home, "-f", str(values))
        try:
            yield _populate(dev_cluster, release, team_a, team_b, tmp_path)
        finally:
            helm(dev_cluster, "uninstall", release, "-n", home)


def _populate(dev_cluster: Any, release: str, team_a: str, team_b: str, tmp_path: Path) -> Tenants:
    clients = dev_cluster.clients
    for namespace in (team_a, team_b):
        job = job_manifest(f"job-{namespace}")
        job["spec"]["profile"] = {"enabled": True}
        create_job(clients, namespace, job)
        write_synthetic_profile(tmp_path / "profiles" / namespace / f"job-{namespace}" / "0", TINY)
    clients.core.create_namespaced_service_account(team_a, {"metadata": {"name": VIEWER}})
    rbac = client.RbacAuthorizationV1Api(clients.api_client)
    rbac.create_namespaced_role(
        team_a,
        {
            "metadata": {"name": VIEWER},
            "rules": [
                {
                    "apiGroups": ["trainium.dev"],
                    "resources": ["trainingjobs"],
                    "verbs": ["get", "list"],
                }
            ],
        },
    )
    rbac.create_namespaced_role_binding(
        team_a,
        {
            "metadata": {"name": VIEWER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": VIEWER},
            "subjects": [{"kind": "ServiceAccount", "name": VIEWER, "namespace": team_a}],
        },
    )
    token = clients.core.create_namespaced_service_account_token(
        VIEWER, team_a, {"spec": {"expirationSeconds": 3600, "audiences": []}}
    ).status.token
    ui_kubeconfig = service_account_kubeconfig(
        clients,
        Path(dev_cluster.kubeconfig),
        namespace=team_a,  # the workload namespace: the profile UI runs there
        service_account=f"{release}-trainium-operator-profile-ui",
        output=tmp_path / "ui-kubeconfig.yaml",
    )
    return Tenants(team_a, team_b, ui_kubeconfig, token, tmp_path / "profiles")


@dataclass
class Answer:
    status: int
    body: Any


def ask(tenants: Tenants, requests: list[tuple[str, str, dict[str, str]]]) -> list[Answer]:
    """The requests, in turn, to the UI in-cluster mode running as the chart's UI account."""
    kubeconfig = str(tenants.ui_kubeconfig)
    app = create_app(
        tenants.profiles,
        job_lister=cluster_job_lister(kubeconfig, [tenants.team_a, tenants.team_b]),
        workers=1,
        access=kubernetes_access(kubeconfig),
    )

    async def run() -> list[Answer]:
        async with TestClient(TestServer(app)) as ui:
            answers = []
            for method, path, headers in requests:
                response = await ui.request(method, path, headers=headers)
                text = await response.text()
                is_json = response.content_type == "application/json"
                answers.append(Answer(response.status, await response.json() if is_json else text))
            return answers

    return asyncio.run(run())


def test_the_ui_shows_a_user_only_what_kubernetes_lets_them_read(tenants: Tenants) -> None:
    viewer = {"Authorization": f"Bearer {tenants.viewer_token}"}
    post = {**viewer, CSRF_HEADER: "1"}
    profile_a = f"{tenants.team_a}/job-{tenants.team_a}/0"
    profile_b = f"{tenants.team_b}/job-{tenants.team_b}/0"

    (
        anonymous,
        forged_token,
        listing,
        other_dashboard,
        other_load,
        own_load,
        own_dashboard,
        load_by_get,
        post_without_csrf,
        rebound,
    ) = ask(
        tenants,
        [
            ("GET", "/api/profiles", {}),
            ("GET", "/api/profiles", {"Authorization": "Bearer not-a-token"}),
            ("GET", "/api/profiles", viewer),
            ("GET", f"/api/dashboard?id={profile_b}", viewer),
            ("POST", f"/api/profiles/load?id={profile_b}&wait=1", post),
            ("POST", f"/api/profiles/load?id={profile_a}&wait=1", post),
            ("GET", f"/api/dashboard?id={profile_a}", viewer),
            ("GET", f"/api/profiles/load?id={profile_a}", viewer),
            ("POST", f"/api/profiles/unload?id={profile_a}", viewer),
            ("GET", "/api/profiles", {**viewer, "Host": "rebound.example:8090"}),
        ],
    )

    assert anonymous.status == 401
    assert forged_token.status == 401
    assert listing.status == 200, listing.body
    assert [row["id"] for row in listing.body["profiles"]] == [profile_a]
    assert [(job["namespace"], job["name"]) for job in listing.body["jobs"]] == [
        (tenants.team_a, f"job-{tenants.team_a}")
    ]
    assert other_dashboard.status == 403
    assert f"system:serviceaccount:{tenants.team_a}:{VIEWER}" in other_dashboard.body
    assert other_load.status == 403
    assert own_load.status == 200, own_load.body
    assert own_load.body["state"] == "loaded"
    assert own_dashboard.body["overview"]["ranks"] == 1
    assert load_by_get.status == 405
    assert post_without_csrf.status == 403
    assert CSRF_HEADER in post_without_csrf.body
    assert rebound.status == 421

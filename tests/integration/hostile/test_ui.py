"""The profile UI against a namespace-scoped user, on the real kube-apiserver of the dev cluster.

On-demand captures live at `<namespace>/<job>/<attempt>/on-demand/<id>`; the UI once read
their namespace as the third segment from the end (`0`), so their owner got 403 and a reader of
a namespace named `0` would have seen every team's. Here a ServiceAccount whose Role reads the
TrainingJobs of team A only calls the UI (`--auth kubernetes`, in-process) with its own token:
every answer is the real API server's TokenReview and SubjectAccessReview. The UI itself runs
with the dev cluster's admin kubeconfig: what it decides is the reviewed user's rights, never
its own, and skipping the chart install keeps this test to seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from kubernetes import client

from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_devcluster import testing
from trainium_operator.ui.app import create_app
from trainium_operator.ui.auth import kubernetes_access
from trainium_operator.ui.guards import CSRF_HEADER

pytestmark = pytest.mark.integration
TINY = SyntheticSpec(nodes=1, ranks_per_node=1, steps=3, detailed_steps=(1, 2), kernels_per_step=2)
VIEWER = "viewer"


@dataclass(frozen=True)
class Teams:
    team_a: str
    team_b: str
    viewer_token: str
    profiles: Path


def _viewer_of(clients: Any, namespace: str) -> str:
    """A ServiceAccount that may get and list the namespace's TrainingJobs; its token."""
    clients.core.create_namespaced_service_account(namespace, {"metadata": {"name": VIEWER}})
    rbac = client.RbacAuthorizationV1Api(clients.api_client)
    rule = {"apiGroups": ["trainium.dev"], "resources": ["trainingjobs"], "verbs": ["get", "list"]}
    rbac.create_namespaced_role(namespace, {"metadata": {"name": VIEWER}, "rules": [rule]})
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": VIEWER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": VIEWER},
            "subjects": [{"kind": "ServiceAccount", "name": VIEWER, "namespace": namespace}],
        },
    )
    token: str = clients.core.create_namespaced_service_account_token(
        VIEWER, namespace, {"spec": {"expirationSeconds": 3600, "audiences": []}}
    ).status.token
    return token


@pytest.fixture
def teams(dev_cluster: Any, tmp_path: Path) -> Iterator[Teams]:
    with (
        testing.fresh_namespace(dev_cluster) as team_a,
        testing.fresh_namespace(dev_cluster) as team_b,
    ):
        profiles = tmp_path / "profiles"
        for namespace in (team_a, team_b):
            attempt = profiles / namespace / "job" / "0"
            write_synthetic_profile(attempt, TINY)
            write_synthetic_profile(attempt / "on-demand" / f"req-{namespace[-4:]}", TINY)
        yield Teams(team_a, team_b, _viewer_of(dev_cluster.clients, team_a), profiles)


def test_a_namespace_scoped_user_opens_their_own_on_demand_capture_and_no_other(
    dev_cluster: Any, teams: Teams, hostile_report: Any
) -> None:
    viewer = {"Authorization": f"Bearer {teams.viewer_token}"}
    post = {**viewer, CSRF_HEADER: "1"}
    own = f"{teams.team_a}/job/0/on-demand/req-{teams.team_a[-4:]}"
    other = f"{teams.team_b}/job/0/on-demand/req-{teams.team_b[-4:]}"
    attempts = [
        ("GET /api/profiles", "list as a team A viewer", "GET", "/api/profiles", viewer),
        (
            "POST /api/profiles/load",
            f"own capture {own}",
            "POST",
            f"/api/profiles/load?id={own}&wait=1",
            post,
        ),
        ("GET /api/dashboard", f"own capture {own}", "GET", f"/api/dashboard?id={own}", viewer),
        (
            "POST /api/profiles/load",
            f"team B capture {other}",
            "POST",
            f"/api/profiles/load?id={other}&wait=1",
            post,
        ),
        (
            "GET /api/dashboard",
            f"team B capture {other}",
            "GET",
            f"/api/dashboard?id={other}",
            viewer,
        ),
        (
            "POST /api/profiles/load",
            "team B capture via ../",
            "POST",
            f"/api/profiles/load?id={teams.team_a}/../{other}",
            post,
        ),
    ]
    app = create_app(
        teams.profiles, workers=1, access=kubernetes_access(str(dev_cluster.kubeconfig))
    )

    async def run() -> list[tuple[int, Any]]:
        async with TestClient(TestServer(app)) as ui:
            answers = []
            for _, _, method, path, headers in attempts:
                response = await ui.request(method, path, headers=headers)
                is_json = response.content_type == "application/json"
                answers.append(
                    (response.status, await response.json() if is_json else await response.text())
                )
            return answers

    answers = asyncio.run(run())
    for (path, attempt, *_), (status, body) in zip(attempts, answers, strict=True):
        hostile_report.tried(f"profile UI {path}", attempt[:48], f"{status} {str(body)[:80]}")

    listing, own_load, own_dashboard, other_load, other_dashboard, traversal = answers
    assert own_load[0] == 200, own_load[1]
    assert listing[0] == 200, listing[1]
    assert [row["id"] for row in listing[1]["profiles"]] == [f"{teams.team_a}/job/0", own]
    assert own_load[1]["state"] == "loaded"
    assert own_dashboard[0] == 200
    assert own_dashboard[1]["overview"]["ranks"] == 1
    assert other_load[0] == 403
    assert teams.team_b in other_load[1]
    assert other_dashboard[0] == 403
    assert traversal[0] == 400

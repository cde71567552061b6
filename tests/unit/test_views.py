"""The reconciler's memo of pod and node views: one reduction per object version, the same
views a pass would compute itself, and a bound on what it keeps."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from trainium_operator.controller.views import Views
from trainium_operator.lifecycle.observed import observe

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def pod(name: str, version: str, phase: str = "Pending") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "resourceVersion": version,
            "labels": {
                "trainium.dev/stage": "train",
                "trainium.dev/attempt": "0",
                "trainium.dev/node-rank": name.rsplit("-", 1)[1],
            },
        },
        "status": {"phase": phase},
    }


def node(name: str, version: str, ready: str = "True") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": version},
        "status": {"conditions": [{"type": "Ready", "status": ready}]},
    }


def test_an_unchanged_pod_version_is_reduced_once_and_a_new_version_again() -> None:
    views = Views()
    first = views.pod(pod("bert-train-0-0", "10"))
    assert views.pod(copy.deepcopy(pod("bert-train-0-0", "10"))) is first
    running = views.pod(pod("bert-train-0-0", "11", phase="Running"))
    assert running is not None
    assert running.phase == "Running"
    assert views.node(node("trn1-0", "5")) is views.node(node("trn1-0", "5"))
    assert not views.node(node("trn1-0", "6", ready="False")).ready


def test_a_pass_sees_the_same_pods_and_nodes_with_the_memo_as_without() -> None:
    views = Views()
    pods = [pod(f"bert-train-0-{rank}", str(100 + rank), "Running") for rank in range(3)]
    nodes = [node(f"trn1-{index}", str(200 + index)) for index in range(3)]
    arguments: dict[str, Any] = {
        "pods": pods,
        "podgroups": [],
        "service_exists": True,
        "nodes": nodes,
        "now": NOW,
    }
    plain = observe(**arguments)
    observe(pod_view=views.pod, node_view=views.node, **arguments)  # fills the memo
    memoised = observe(pod_view=views.pod, node_view=views.node, **arguments)
    assert memoised == plain


def test_objects_without_a_version_are_reduced_every_time_and_the_memo_is_bounded() -> None:
    views = Views(limit=2)
    unversioned = pod("bert-train-0-0", "")
    assert views.pod(unversioned) is not views.pod(unversioned)
    for rank in range(5):
        views.pod(pod(f"bert-train-0-{rank}", str(rank + 1)))
    assert len(views.pod) <= 2

"""The opt-in topology reconciler (controller/topology.py) against the in-memory cluster: what it
writes as nodes come and go, that it never touches an object without its managed-by labels,
and that it calls a scheduler's API only when it writes for that scheduler (the ground for the
chart granting each only with its value). That it works on real Volcano and Kueue is the
integration tier's (tests/integration/test_topology.py)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from typing import Any

import pytest

from trainium_operator.api import topology
from trainium_operator.builders.topology import network_topology
from trainium_operator.controller import topology as controller_topology
from trainium_operator.controller.cache import ClusterCache
from trainium_operator.controller.topology import TopologyReconciler
from trainium_operator.k8s.informer import WatchEvent
from unit.fake_cluster import FakeCluster, Write, api_error
from unit.topology_nodes import (
    BLOCK_A,
    BOTH,
    LAYER1,
    LAYER2,
    TRN2U_NODES,
    ULTRASERVER,
    Obj,
    node,
    trn1_nodes,
)


class Nodes:
    """The node list the reconciler reads (the operator's node watch, here set by the test)."""

    def __init__(self, nodes: list[Obj]) -> None:
        self.nodes = nodes

    def __call__(self) -> list[Obj]:
        return copy.deepcopy(self.nodes)


def reconciler(
    nodes: Nodes, schedulers: frozenset[str] = BOTH
) -> tuple[TopologyReconciler, FakeCluster]:
    cluster = FakeCluster(ClusterCache())
    return TopologyReconciler(cluster, nodes, schedulers), cluster


def written(cluster: FakeCluster) -> list[Write]:
    return [w for w in cluster.writes if w.verb != "list"]


def test_the_first_pass_creates_every_object_and_the_next_writes_nothing() -> None:
    topo, cluster = reconciler(Nodes(trn1_nodes()))

    topo.sync()
    first = written(cluster)
    cluster.writes.clear()
    topo.sync()

    assert [w.kind for w in first] == ["Topology", "ResourceFlavor", *["HyperNode"] * 4]
    assert all(w.verb == "create" for w in first)
    assert written(cluster) == []


def test_a_node_added_and_removed_changes_only_its_domains() -> None:
    nodes = Nodes(trn1_nodes()[:2])
    topo, cluster = reconciler(nodes, frozenset({"volcano"}))
    topo.sync()
    cluster.writes.clear()

    nodes.nodes = trn1_nodes()
    topo.sync()
    added = written(cluster)
    cluster.writes.clear()
    nodes.nodes = trn1_nodes()[:2]
    topo.sync()
    removed = written(cluster)

    assert [(w.verb, w.kind) for w in added] == [("create", "HyperNode"), ("update", "HyperNode")]
    # The spine stops listing the block before the block goes: no member is ever missing.
    assert [(w.verb, w.kind) for w in removed] == [("update", "HyperNode"), ("delete", "HyperNode")]
    assert added[0].name == removed[1].name  # the second block came and went


def test_an_object_without_the_managed_by_labels_is_never_changed_or_deleted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    topo, cluster = reconciler(Nodes(trn1_nodes()), frozenset({"volcano"}))
    wanted = network_topology(trn1_nodes(), {"volcano"}).of_kind("HyperNode")
    admins = copy.deepcopy(wanted[0])
    admins["metadata"]["labels"] = {"owner": "admin"}
    admins["spec"]["members"] = [{"type": "Node", "selector": {"exactMatch": {"name": "x"}}}]
    cluster.add_object(admins)
    unrelated = {
        "kind": "HyperNode",
        "metadata": {"name": "rack-7", "labels": {}},
        "spec": {"tier": 1, "members": []},
    }
    cluster.add_object(unrelated)

    with caplog.at_level(logging.WARNING):
        outcome = topo.sync()

    assert outcome.taken == [f"HyperNode {admins['metadata']['name']}"]
    assert cluster.objects[("HyperNode", admins["metadata"]["name"])]["spec"] == admins["spec"]
    assert ("HyperNode", "rack-7") in cluster.objects
    touched = {w.name for w in written(cluster) if w.verb in ("update", "delete")}
    assert touched == set()
    assert "another owner's objects, left alone" in caplog.text


@pytest.mark.parametrize(
    ("schedulers", "kinds"),
    [
        ({"volcano"}, {"HyperNode"}),
        ({"kueue"}, {"Topology", "ResourceFlavor"}),
    ],
)
def test_only_the_chosen_schedulers_kinds_are_read_or_written(
    schedulers: set[str], kinds: set[str]
) -> None:
    topo, cluster = reconciler(Nodes(trn1_nodes()), frozenset(schedulers))

    topo.sync()

    assert {w.kind for w in cluster.writes} == kinds


def test_a_refused_write_fails_the_pass_for_the_loop_to_retry() -> None:
    topo, cluster = reconciler(Nodes(trn1_nodes()), frozenset({"volcano"}))
    cluster.refuse("create", "HyperNode", api_error(403, 'cannot create resource "hypernodes"'))

    with pytest.raises(Exception, match="hypernodes"):
        topo.sync()


def test_left_out_nodes_are_reported_once_per_change(caplog: pytest.LogCaptureFixture) -> None:
    nodes = Nodes([*trn1_nodes(), node("unlabelled", "trn2u.48xlarge", LAYER1, LAYER2, BLOCK_A)])
    topo, _cluster = reconciler(nodes)

    with caplog.at_level(logging.WARNING):
        topo.sync()
        topo.sync()

    reports = [r for r in caplog.records if "left out" in r.getMessage()]
    assert len(reports) == 1
    assert "unlabelled" in reports[0].getMessage()
    assert topology.ULTRASERVER_LABEL in reports[0].getMessage()


def event(kind: str, obj: Obj) -> WatchEvent:
    return WatchEvent(kind, copy.deepcopy(obj))


def test_only_a_topology_change_of_a_trainium_node_wakes_the_reconciler() -> None:
    topo, _cluster = reconciler(Nodes([]))
    trn2u = node(TRN2U_NODES[0], "trn2u.48xlarge", LAYER1, LAYER2, BLOCK_A, ultraserver=ULTRASERVER)
    not_ready = copy.deepcopy(trn2u)
    not_ready["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
    moved = copy.deepcopy(trn2u)
    moved["metadata"]["labels"][topology.ULTRASERVER_LABEL] = "othersrv"

    assert topo.node_changed(event("ADDED", trn2u))
    assert not topo.node_changed(event("MODIFIED", not_ready))  # readiness: not topology
    assert topo.node_changed(event("MODIFIED", moved))
    assert topo.node_changed(event("DELETED", moved))
    assert not topo.node_changed(event("ADDED", node("sys-0", "m5.large", LAYER1)))


# -- the loop -------------------------------------------------------------------------------


class CountingReconciler(TopologyReconciler):
    def __init__(self, failures: list[Exception]) -> None:
        super().__init__(FakeCluster(ClusterCache()), Nodes([]), frozenset({"volcano"}))
        self.failures = failures
        self.passes = 0

    def sync(self) -> Any:
        self.passes += 1
        if self.failures:
            raise self.failures.pop(0)
        return super().sync()


def run_loop(
    reconciler: TopologyReconciler,
    monkeypatch: pytest.MonkeyPatch,
    *,
    ready: bool = True,
    may_work: bool = True,
    seconds: float = 0.3,
) -> None:
    for name in ("DEBOUNCE_SECONDS", "RETRY_SECONDS", "SETUP_RETRY_SECONDS", "NOT_READY_SECONDS"):
        monkeypatch.setattr(controller_topology, name, 0.01)

    async def bounded() -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                controller_topology.run(
                    reconciler, asyncio.Event(), lambda: ready, lambda: may_work
                ),
                timeout=seconds,
            )

    asyncio.run(bounded())


def test_the_loop_passes_once_ready_and_then_waits_for_a_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topo = CountingReconciler([])

    run_loop(topo, monkeypatch)

    assert topo.passes == 1


@pytest.mark.parametrize(("ready", "may_work"), [(False, True), (True, False)])
def test_the_loop_writes_nothing_before_the_node_list_or_in_a_standby_replica(
    monkeypatch: pytest.MonkeyPatch, ready: bool, may_work: bool
) -> None:
    topo = CountingReconciler([])

    run_loop(topo, monkeypatch, ready=ready, may_work=may_work)

    assert topo.passes == 0


def test_a_missing_scheduler_api_is_said_plainly_and_retried(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    topo = CountingReconciler([api_error(404, "the server could not find the requested resource")])

    with caplog.at_level(logging.ERROR):
        run_loop(topo, monkeypatch)

    assert topo.passes == 2, "retried after the failure, then quiet"
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "HyperNodes: Volcano v1.12 or newer" in record.getMessage()
    assert record.exc_info is None, "no traceback for an API that is not installed"

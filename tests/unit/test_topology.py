"""The network topology model: nodes with the labels AWS documents (unit/topology_nodes.py) ->
Volcano HyperNodes and a Kueue Topology with its ResourceFlavor (builders/topology.py), and the
writes that keep them (lifecycle/topology.py)."""

from __future__ import annotations

import random
import re

import pytest

from trainium_operator.api import topology
from trainium_operator.api.instance_types import INSTANCE_TYPE_LABEL
from trainium_operator.builders import topology as builder
from trainium_operator.builders.topology import network_topology
from trainium_operator.lifecycle.topology import plan_writes
from unit.topology_nodes import (
    BLOCK_A,
    BLOCK_B,
    BOTH,
    LAYER1,
    LAYER2,
    TRN2U_NODES,
    ULTRASERVER,
    Obj,
    node,
    trn1_nodes,
)

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def by_tier(objects: list[Obj]) -> dict[int, list[Obj]]:
    tiers: dict[int, list[Obj]] = {}
    for obj in objects:
        tiers.setdefault(obj["spec"]["tier"], []).append(obj)
    return tiers


def members(hypernode: Obj) -> set[tuple[str, str]]:
    return {(m["type"], m["selector"]["exactMatch"]["name"]) for m in hypernode["spec"]["members"]}


def test_trn1_nodes_become_blocks_under_one_spine_under_one_layer_1() -> None:
    built = network_topology(trn1_nodes(), BOTH)

    tiers = by_tier(built.of_kind("HyperNode"))
    assert sorted(tiers) == [2, 3, 4]  # no UltraServer tier on trn1
    blocks, (spine,), (layer1,) = tiers[2], tiers[3], tiers[4]
    assert {frozenset(members(b)) for b in blocks} == {
        frozenset({("Node", "trn1-a0"), ("Node", "trn1-a1")}),
        frozenset({("Node", "trn1-b0"), ("Node", "trn1-b1")}),
    }
    assert members(spine) == {("HyperNode", b["metadata"]["name"]) for b in blocks}
    assert members(layer1) == {("HyperNode", spine["metadata"]["name"])}
    assert [b["spec"]["tierName"] for b in (*blocks, spine, layer1)] == [
        "block",
        "block",
        "spine",
        "layer-1",
    ]
    assert built.left_out == ()


def test_trn1_gets_a_kueue_topology_of_its_three_layers_and_a_flavor_naming_it() -> None:
    built = network_topology(trn1_nodes(), BOTH)

    (kueue_topology,) = built.of_kind("Topology")
    (flavor,) = built.of_kind("ResourceFlavor")
    assert kueue_topology["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert [level["nodeLabel"] for level in kueue_topology["spec"]["levels"]] == [
        "topology.k8s.aws/network-node-layer-1",
        "topology.k8s.aws/network-node-layer-2",
        "topology.k8s.aws/network-node-layer-3",
        "kubernetes.io/hostname",
    ]
    assert flavor["spec"] == {
        "nodeLabels": {INSTANCE_TYPE_LABEL: "trn1.32xlarge"},
        "topologyName": kueue_topology["metadata"]["name"],
    }
    assert flavor["metadata"]["name"] == "trainium-trn1-32xlarge"


def test_trn2_has_no_ultraserver_level_even_with_a_stray_ultraserver_label() -> None:
    nodes = [
        node(f"trn2-{i}", "trn2.48xlarge", LAYER1, LAYER2, BLOCK_A, ultraserver=ULTRASERVER)
        for i in range(2)
    ]

    built = network_topology(nodes, BOTH)

    assert sorted(by_tier(built.of_kind("HyperNode"))) == [2, 3, 4]
    (kueue_topology,) = built.of_kind("Topology")
    assert topology.ULTRASERVER_LABEL not in str(kueue_topology["spec"])


def test_four_trn2u_instances_of_one_ultraserver_are_one_tier_1_hypernode_in_their_block() -> None:
    nodes = [
        node(name, "trn2u.48xlarge", LAYER1, LAYER2, BLOCK_A, ultraserver=ULTRASERVER)
        for name in TRN2U_NODES
    ]

    built = network_topology(nodes, BOTH)

    tiers = by_tier(built.of_kind("HyperNode"))
    (ultraserver,), (block,) = tiers[1], tiers[2]
    assert ultraserver["spec"]["tierName"] == "ultraserver"
    assert members(ultraserver) == {("Node", name) for name in TRN2U_NODES}
    assert members(block) == {("HyperNode", ultraserver["metadata"]["name"])}
    (kueue_topology,) = built.of_kind("Topology")
    levels = [level["nodeLabel"] for level in kueue_topology["spec"]["levels"]]
    assert levels[-2:] == [topology.ULTRASERVER_LABEL, "kubernetes.io/hostname"]


def test_trn1_and_trn2u_under_one_layer_1_share_it_with_one_tier_per_level() -> None:
    nodes = trn1_nodes() + [
        node(
            name, "trn2u.48xlarge", LAYER1, LAYER2, "nn-5e5e5e5e5e5e5e5e5", ultraserver=ULTRASERVER
        )
        for name in TRN2U_NODES
    ]

    built = network_topology(nodes, BOTH)

    hypernodes = built.of_kind("HyperNode")
    tier_of = {h["spec"]["tierName"]: h["spec"]["tier"] for h in hypernodes}
    assert tier_of == {"ultraserver": 1, "block": 2, "spine": 3, "layer-1": 4}
    assert len(by_tier(hypernodes)[4]) == 1
    assert {f["metadata"]["name"] for f in built.of_kind("ResourceFlavor")} == {
        "trainium-trn1-32xlarge",
        "trainium-trn2u-48xlarge",
    }


def test_nodes_lacking_a_label_are_left_out_and_named_others_ignored() -> None:
    nodes = [
        *trn1_nodes(),
        node("no-layer-3", "trn1.32xlarge", LAYER1, LAYER2),
        node("trn2u-without-plugin-label", "trn2u.48xlarge", LAYER1, LAYER2, BLOCK_A),
        node("system-0", "m5.large", LAYER1, LAYER2, BLOCK_A),
    ]

    built = network_topology(nodes, BOTH)

    assert built.left_out == ("no-layer-3", "trn2u-without-plugin-label")
    assert built.left_out_count == 2
    named = {m[1] for h in built.of_kind("HyperNode") for m in members(h)}
    assert not {"no-layer-3", "trn2u-without-plugin-label", "system-0"} & named
    assert {f["metadata"]["name"] for f in built.of_kind("ResourceFlavor")} == {
        "trainium-trn1-32xlarge"
    }


def test_the_same_nodes_in_any_order_build_the_same_objects() -> None:
    nodes = trn1_nodes() + [
        node(name, "trn2u.48xlarge", LAYER1, LAYER2, BLOCK_B, ultraserver=ULTRASERVER)
        for name in TRN2U_NODES
    ]
    shuffled = nodes[:]
    random.Random(7).shuffle(shuffled)

    assert network_topology(shuffled, BOTH) == network_topology(nodes, BOTH)


def test_every_object_carries_the_managed_by_labels() -> None:
    built = network_topology(trn1_nodes(), BOTH)

    assert built.objects
    for obj in built.objects:
        assert obj["metadata"]["labels"] == topology.MANAGED_LABELS


def test_names_stay_dns_labels_of_at_most_63_characters_however_long_the_values() -> None:
    long_value = "N" + "_x." * 20 + "z"  # 62 characters, capitals, '_' and '.'
    nodes = [
        node("a", "trn2u.48xlarge", long_value, long_value + "2", long_value, ultraserver="U" * 63),
        node("b", "trn2u.48xlarge", long_value, long_value + "3", long_value, ultraserver="U" * 63),
    ]

    built = network_topology(nodes, BOTH)

    names = [o["metadata"]["name"] for o in built.objects]
    assert all(len(n) <= 63 and DNS_LABEL.match(n) for n in names), names
    # The same layer-3 and UltraServer values under two spines are two domains, not one
    # HyperNode with two parents.
    hypernode_names = [h["metadata"]["name"] for h in built.of_kind("HyperNode")]
    assert len(set(hypernode_names)) == len(hypernode_names) == 7
    assert len(by_tier(built.of_kind("HyperNode"))[1]) == 2


def test_a_domain_name_is_its_level_its_value_and_a_hash_of_its_path() -> None:
    first = builder.hypernode_name(topology.TopologyLevel.BLOCK, (LAYER1, LAYER2, BLOCK_A))
    again = builder.hypernode_name(topology.TopologyLevel.BLOCK, (LAYER1, LAYER2, BLOCK_A))
    elsewhere = builder.hypernode_name(topology.TopologyLevel.BLOCK, (LAYER1, "nn-other", BLOCK_A))

    assert first == again
    assert first.startswith(f"trainium-block-{BLOCK_A}-")
    assert elsewhere != first


def test_nodes_past_the_bound_are_left_out_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builder, "MAX_NODES", 3)

    built = network_topology(trn1_nodes(), BOTH)

    assert (built.placed, built.over_bound) == (3, 1)
    named = {m[1] for h in built.of_kind("HyperNode") for m in members(h)}
    assert "trn1-b1" not in named  # the last by name


@pytest.mark.parametrize(
    ("schedulers", "kinds"),
    [
        ({"volcano"}, {"HyperNode"}),
        ({"kueue"}, {"Topology", "ResourceFlavor"}),
        (set(), set()),
    ],
)
def test_only_the_chosen_schedulers_objects_are_built(
    schedulers: set[str], kinds: set[str]
) -> None:
    built = network_topology(trn1_nodes(), schedulers)

    assert {o["kind"] for o in built.objects} == kinds


# -- the writes ---------------------------------------------------------------------------


def stored(obj: Obj, version: str = "7") -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}


def test_nothing_is_written_when_everything_is_as_built() -> None:
    wanted = list(network_topology(trn1_nodes(), BOTH).objects)

    assert plan_writes(wanted, [stored(o) for o in wanted]).empty


def test_a_new_node_creates_its_block_and_replaces_the_spine_listing_it() -> None:
    before = [stored(o) for o in network_topology(trn1_nodes()[:2], {"volcano"}).objects]
    wanted = list(network_topology(trn1_nodes(), {"volcano"}).objects)

    writes = plan_writes(wanted, before)

    assert [o["spec"]["tierName"] for o in writes.create] == ["block"]
    (spine,) = writes.replace
    assert spine["spec"]["tierName"] == "spine"
    assert spine["metadata"]["resourceVersion"] == "7"  # a concurrent change fails with 409
    assert writes.delete == []


def test_a_block_whose_last_node_went_is_deleted_before_nothing_else() -> None:
    before = [stored(o) for o in network_topology(trn1_nodes(), BOTH).objects]
    wanted = list(network_topology(trn1_nodes()[:2], BOTH).objects)

    writes = plan_writes(wanted, before)

    assert [(o["kind"], o["spec"]["tierName"]) for o in writes.delete] == [("HyperNode", "block")]
    assert [o["spec"]["tierName"] for o in writes.replace] == ["spine"]


def test_kueue_objects_stay_when_the_last_node_of_their_type_goes() -> None:
    before = [stored(o) for o in network_topology(trn1_nodes(), BOTH).objects]

    writes = plan_writes([], before)

    assert {o["kind"] for o in writes.delete} == {"HyperNode"}
    assert [o["spec"]["tier"] for o in writes.delete] == [4, 3, 2, 2]  # top tier first


def test_a_changed_kueue_topology_is_deleted_to_be_created_again_not_replaced() -> None:
    wanted = list(network_topology(trn1_nodes(), {"kueue"}).objects)
    old = stored(wanted[0])
    old["spec"] = {"levels": [{"nodeLabel": "kubernetes.io/hostname"}]}

    writes = plan_writes(wanted, [old, stored(wanted[1])])

    assert writes.delete == [old]
    assert writes.create == writes.replace == []


def test_an_object_being_deleted_is_left_to_go_first() -> None:
    wanted = list(network_topology(trn1_nodes(), {"kueue"}).objects)
    going = stored(wanted[0])
    going["metadata"]["deletionTimestamp"] = "2026-12-05T12:00:00Z"

    writes = plan_writes(wanted, [going, stored(wanted[1])])

    assert writes.empty


def test_creations_go_lower_tiers_first_after_the_topology_their_flavor_names() -> None:
    wanted = list(
        network_topology(
            [
                node(name, "trn2u.48xlarge", LAYER1, LAYER2, BLOCK_A, ultraserver=ULTRASERVER)
                for name in TRN2U_NODES
            ],
            BOTH,
        ).objects
    )

    writes = plan_writes(wanted, [])

    assert [o["kind"] for o in writes.create[:2]] == ["Topology", "ResourceFlavor"]
    assert [o["spec"]["tier"] for o in writes.create[2:]] == [1, 2, 3, 4]

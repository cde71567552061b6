"""The dev cluster's fake nodes carry a believable network topology, fixed by each node's index:
4 nodes per layer-3 block (8 on trn2u, two UltraServers of 4), 2 blocks per spine, 2 spines per
layer-1 node, with ids of the forms AWS shows. Checked through the operator's own topology
builder, which is what the topology reconciler writes from them."""

from __future__ import annotations

import re
from collections import Counter

from trainium_devcluster import objects
from trainium_operator.api import topology
from trainium_operator.builders.topology import network_topology, node_place

NETWORK_NODE_ID = re.compile(r"^nn-[0-9a-f]{17}$")  # EKS's form, e.g. nn-e50490a237cb0f01a
ULTRASERVER_ID = re.compile(r"^[0-9a-z]{16}$")  # the Neuron docs' form, e.g. bog79p1y8tetj5uu


def tier_sizes(nodes: list[dict[str, object]]) -> dict[str, list[int]]:
    """Per level, the number of members of each of its HyperNodes."""
    sizes: dict[str, list[int]] = {}
    for hypernode in network_topology(nodes, {"volcano"}).of_kind("HyperNode"):
        spec = hypernode["spec"]
        sizes.setdefault(spec["tierName"], []).append(len(spec["members"]))
    return {level: sorted(counts) for level, counts in sizes.items()}


def test_sixteen_trn1_nodes_sit_in_four_blocks_two_spines_and_one_layer_1() -> None:
    nodes = objects.fake_nodes(16, "trn1.32xlarge")

    assert tier_sizes(nodes) == {"block": [4, 4, 4, 4], "spine": [2, 2], "layer-1": [2]}
    blocks = Counter(n["metadata"]["labels"][topology.LAYER_LABELS[3]] for n in nodes)
    assert list(blocks.values()) == [4, 4, 4, 4]  # consecutive indices share a block


def test_trn2u_nodes_come_in_ultraservers_of_four_two_to_a_block() -> None:
    nodes = objects.fake_nodes(8, "trn2u.48xlarge")

    assert tier_sizes(nodes) == {
        "ultraserver": [4, 4],
        "block": [2],
        "spine": [1],
        "layer-1": [1],
    }
    servers = [n["metadata"]["labels"][topology.ULTRASERVER_LABEL] for n in nodes]
    assert servers[:4] == [servers[0]] * 4 != servers[4:]
    assert [n["metadata"]["labels"][objects.ULTRASERVER_NODE_LABEL] for n in nodes[:4]] == [
        "0",
        "1",
        "2",
        "3",
    ]


def test_every_fake_trainium_node_is_placed_with_ids_of_the_forms_aws_shows() -> None:
    for instance_type in ("trn1.2xlarge", "trn1.32xlarge", "trn2.48xlarge", "trn2u.48xlarge"):
        for node in objects.fake_nodes(5, instance_type):
            place = node_place(node)
            assert place is not None, node["metadata"]["name"]
            *layers, last = place.path
            assert all(NETWORK_NODE_ID.match(value) for value in layers)
            expected = ULTRASERVER_ID if instance_type == "trn2u.48xlarge" else NETWORK_NODE_ID
            assert expected.match(last)


def test_a_node_added_later_gets_the_labels_of_its_index() -> None:
    all_at_once = objects.fake_nodes(6, "trn2u.48xlarge")
    added = objects.fake_nodes(2, "trn2u.48xlarge", first_index=4)

    assert [n["metadata"]["labels"] for n in added] == [
        n["metadata"]["labels"] for n in all_at_once[4:]
    ]


def test_other_types_do_not_share_the_fake_network() -> None:
    trn1 = objects.topology_labels("trn1.32xlarge", 0)
    trn2 = objects.topology_labels("trn2.48xlarge", 0)

    assert trn1[topology.LAYER_LABELS[1]] != trn2[topology.LAYER_LABELS[1]]
    assert topology.ULTRASERVER_LABEL not in trn2

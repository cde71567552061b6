"""The one pure function from nodes to the schedulers' topology objects (api/topology.py says
what is read and why).

From each Trainium node's instance type and AWS labels (`node_place`), `network_topology`
builds:
- for Volcano, HyperNodes (topology.volcano.sh/v1alpha1), tier by tier: the bottom domain of a
  node (its UltraServer on trn2u, else its layer-3 block) lists the node by exact name, each
  higher domain lists the HyperNodes of the domains under it. A domain is keyed by its whole
  path from layer 1 down, so the result is always a tree (a HyperNode with two parents is an
  error to Volcano), even if two layer-2 nodes ever reported the same layer-3 value;
- for Kueue, per instance type seen, a Topology (kueue.x-k8s.io/v1beta2, levels top to bottom
  ending in kubernetes.io/hostname) and a ResourceFlavor selecting the type's nodes and naming
  that Topology.

A node that lacks any label its type's levels need is left out (and named, up to a bound):
Kueue's TAS leaves such nodes out of a flavor's topology too (pkg/util/tas/node.go,
NodeMatchesFlavor, v0.19.2). Labels are EKS's and the Neuron device plugin's, not a tenant's;
counts are bounded anyway: at most MAX_NODES nodes are placed (by name), every object name is
at most 63 characters, deterministic, and hashed from the domain's whole path.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from trainium_operator.api import kueue, topology
from trainium_operator.api.instance_types import INSTANCE_TYPE_LABEL, INSTANCE_TYPES
from trainium_operator.api.objects import Obj
from trainium_operator.api.topology import LEVELS, TopologyLevel

MAX_NODES = 5000
MAX_NAMED_LEFT_OUT = 20
MAX_NAME = 63
HASH_CHARS = 10
NAME_PREFIX = "trainium"
# A label value may hold '_' and '.' and capitals; object names may not: anything else is '-'.
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class NodePlace:
    """Where one node sits: its type and its domains' values, top level first (layer 1, 2, 3,
    then the UltraServer on trn2u)."""

    name: str
    instance_type: str
    path: tuple[str, ...]


def node_place(node: Obj) -> NodePlace | None:
    """The node's place, or None: not a Trainium type, or a label its levels need is missing."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    instance_type = labels.get(INSTANCE_TYPE_LABEL)
    if instance_type not in INSTANCE_TYPES:
        return None
    values = [labels.get(LEVELS[level].node_label) for level in topology.levels_of(instance_type)]
    if not all(isinstance(v, str) and v for v in values):
        return None
    return NodePlace(str(meta["name"]), instance_type, tuple(str(v) for v in values))


def is_trainium(node: Obj) -> bool:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(INSTANCE_TYPE_LABEL) in INSTANCE_TYPES


def object_name(*parts: str, key: tuple[str, ...] = ()) -> str:
    """`trainium-<parts>` as a DNS label; with `key`, a hash of the whole key ends it, so two
    domains never share a name however their readable part was cut to fit 63 characters."""
    readable = _NOT_NAME.sub("-", "-".join((NAME_PREFIX, *parts)).lower()).strip("-")
    if not key:
        return readable[:MAX_NAME].rstrip("-")
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:HASH_CHARS]
    return f"{readable[: MAX_NAME - HASH_CHARS - 1].rstrip('-')}-{digest}"


def hypernode_name(level: TopologyLevel, key: tuple[str, ...]) -> str:
    """A domain's HyperNode: its level, its own value (the last of its path) and the path's
    hash, e.g. trainium-block-nn-e50490a237cb0f01a-3fa2b1c94d."""
    return object_name(level.value, key[-1], key=key)


def kueue_name(instance_type: str) -> str:
    """The Topology and the ResourceFlavor of one instance type: trainium-trn2u-48xlarge."""
    return object_name(instance_type)


def _metadata(name: str) -> Obj:
    return {"name": name, "labels": dict(topology.MANAGED_LABELS)}


@dataclass
class _Domain:
    level: TopologyLevel
    key: tuple[str, ...]
    nodes: set[str] = field(default_factory=set)
    children: set[str] = field(default_factory=set)  # HyperNode names


def hypernode(domain_level: TopologyLevel, key: tuple[str, ...], members: list[Obj]) -> Obj:
    return {
        "apiVersion": f"{topology.HYPERNODE_GROUP}/{topology.HYPERNODE_VERSION}",
        "kind": "HyperNode",
        "metadata": _metadata(hypernode_name(domain_level, key)),
        "spec": {
            "tier": LEVELS[domain_level].tier,
            "tierName": domain_level.value,
            "members": members,
        },
    }


def _members(member_type: str, names: Iterable[str]) -> list[Obj]:
    return [{"type": member_type, "selector": {"exactMatch": {"name": n}}} for n in sorted(names)]


def hypernodes(places: Iterable[NodePlace]) -> list[Obj]:
    """Volcano's HyperNodes of the placed nodes, smallest tier first, then by name."""
    domains: dict[tuple[TopologyLevel, tuple[str, ...]], _Domain] = {}
    for place in places:
        levels = topology.levels_of(place.instance_type)
        below: str | None = None
        for depth in range(len(levels) - 1, -1, -1):  # the bottom domain first
            level, key = levels[depth], place.path[: depth + 1]
            domain = domains.setdefault((level, key), _Domain(level, key))
            if below is None:
                domain.nodes.add(place.name)
            else:
                domain.children.add(below)
            below = hypernode_name(level, key)
    built = [
        hypernode(d.level, d.key, _members("Node", d.nodes) + _members("HyperNode", d.children))
        for d in domains.values()
    ]
    return sorted(built, key=lambda o: (o["spec"]["tier"], o["metadata"]["name"]))


def kueue_topology(instance_type: str) -> Obj:
    return {
        "apiVersion": f"{kueue.KUEUE_GROUP}/{kueue.KUEUE_VERSION}",
        "kind": "Topology",
        "metadata": _metadata(kueue_name(instance_type)),
        "spec": {
            "levels": [{"nodeLabel": label} for label in topology.kueue_levels(instance_type)]
        },
    }


def resource_flavor(instance_type: str) -> Obj:
    """The type's TAS flavor: its nodes (by instance type) and their Topology. A ClusterQueue
    lists it by name to give jobs of that type topology-aware placement."""
    return {
        "apiVersion": f"{kueue.KUEUE_GROUP}/{kueue.KUEUE_VERSION}",
        "kind": "ResourceFlavor",
        "metadata": _metadata(kueue_name(instance_type)),
        "spec": {
            "nodeLabels": {INSTANCE_TYPE_LABEL: instance_type},
            "topologyName": kueue_name(instance_type),
        },
    }


@dataclass(frozen=True)
class TopologyObjects:
    """What `network_topology` builds, and which nodes it left out."""

    objects: tuple[Obj, ...]
    placed: int
    left_out: tuple[str, ...]  # Trainium nodes lacking a label their levels need (bounded)
    left_out_count: int
    over_bound: int  # placeable nodes past MAX_NODES

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]


def network_topology(nodes: Iterable[Obj], schedulers: Collection[str]) -> TopologyObjects:
    """Nodes -> the topology objects of `schedulers` (api/topology.SCHEDULERS). Deterministic:
    the same nodes in any order give the same objects in the same order."""
    placed: list[NodePlace] = []
    left_out: list[str] = []
    for node in nodes:
        if not is_trainium(node):
            continue
        place = node_place(node)
        if place is None:
            left_out.append(str((node.get("metadata") or {}).get("name")))
        else:
            placed.append(place)
    placed.sort(key=lambda p: p.name)
    kept = placed[:MAX_NODES]
    objects: list[Obj] = []
    if topology.KUEUE in schedulers:
        for instance_type in sorted({p.instance_type for p in kept}):
            objects += [kueue_topology(instance_type), resource_flavor(instance_type)]
    if topology.VOLCANO in schedulers:
        objects += hypernodes(kept)
    left_out.sort()
    return TopologyObjects(
        objects=tuple(objects),
        placed=len(kept),
        left_out=tuple(left_out[:MAX_NAMED_LEFT_OUT]),
        left_out_count=len(left_out),
        over_bound=len(placed) - len(kept),
    )

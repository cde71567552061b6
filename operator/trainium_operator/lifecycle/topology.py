"""The topology reconciler's decision: the writes that bring the operator's topology objects
from what exists to what `builders.topology.network_topology` built. Pure.

`existing` holds only objects carrying the operator's managed-by labels (the reconciler lists
with that selector): nothing else is ever changed or deleted. A wanted name taken by an object
without the labels makes the create fail with AlreadyExists, which the reconciler reports and
leaves alone.

- HyperNodes follow the nodes: created, replaced when their members (or tier) changed, deleted
  when their domain has no node left (Volcano refuses a HyperNode without members).
- Kueue's Topology and ResourceFlavor are kept when the last node of their instance type goes:
  a node group scaled to zero keeps its flavor, and the ClusterQueue that lists it its quota.
  Their specs are immutable once written (Topology levels; a flavor's nodeLabels and
  topologyName: apis/kueue/v1beta2, v0.19.2), so a changed one is deleted and created again on
  a later pass, once the deletion is through (Kueue holds a flavor a ClusterQueue uses).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainium_operator.api.objects import Obj

# Kinds whose objects stay when no node wants them any more.
KEPT_KINDS = frozenset({"Topology", "ResourceFlavor"})
# Kinds whose spec may be replaced in place.
REPLACEABLE_KINDS = frozenset({"HyperNode"})
# Creation order (a flavor names its Topology; a HyperNode its lower tier's), deletion reversed.
_KIND_ORDER = {"Topology": 0, "ResourceFlavor": 1, "HyperNode": 2}


def _key(obj: Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _order(obj: Obj) -> tuple[int, int, str]:
    tier = (obj.get("spec") or {}).get("tier", 0)
    return _KIND_ORDER.get(obj["kind"], 9), int(tier) if isinstance(tier, int) else 0, _key(obj)[1]


@dataclass
class TopologyWrites:
    create: list[Obj] = field(default_factory=list)
    replace: list[Obj] = field(default_factory=list)  # carrying the existing resourceVersion
    delete: list[Obj] = field(default_factory=list)  # the existing objects

    @property
    def empty(self) -> bool:
        return not (self.create or self.replace or self.delete)

    def summary(self) -> str:
        def names(objects: list[Obj]) -> str:
            return ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in objects[:8]) + (
                f" and {len(objects) - 8} more" if len(objects) > 8 else ""
            )

        parts = [
            f"{verb} {len(objects)} ({names(objects)})"
            for verb, objects in (
                ("create", self.create),
                ("replace", self.replace),
                ("delete", self.delete),
            )
            if objects
        ]
        return "; ".join(parts) or "nothing to write"


def _same(wanted: Obj, existing: Obj) -> bool:
    labels = (existing.get("metadata") or {}).get("labels") or {}
    wanted_labels = wanted["metadata"]["labels"]
    return wanted.get("spec") == existing.get("spec") and all(
        labels.get(k) == v for k, v in wanted_labels.items()
    )


def plan_writes(wanted: list[Obj], existing: list[Obj]) -> TopologyWrites:
    """The creates, replaces and deletes from `existing` (the operator's own objects) to
    `wanted`, creations lower tiers first, deletions higher tiers first."""
    writes = TopologyWrites()
    have = {_key(o): o for o in existing}
    want = {_key(o): o for o in wanted}
    for key, obj in want.items():
        current = have.get(key)
        if current is None:
            writes.create.append(obj)
        elif current["metadata"].get("deletionTimestamp"):
            continue  # a deletion still under way: created again once it is gone
        elif _same(obj, current):
            continue
        elif obj["kind"] in REPLACEABLE_KINDS:
            version = current["metadata"].get("resourceVersion")
            metadata = {**obj["metadata"], **({"resourceVersion": version} if version else {})}
            writes.replace.append({**obj, "metadata": metadata})
        else:
            writes.delete.append(current)  # immutable: recreated on a later pass
    for key, current in have.items():
        if key in want or current["metadata"].get("deletionTimestamp"):
            continue
        if current["kind"] not in KEPT_KINDS:
            writes.delete.append(current)
    writes.create.sort(key=_order)
    writes.replace.sort(key=_order)
    writes.delete.sort(key=_order, reverse=True)
    return writes

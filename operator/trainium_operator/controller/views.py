"""Each pod's and node's reduction to what the lifecycle reads, kept per object version.

Every pass of a job reduces all its pods (`lifecycle.observed.pod_view`) and the cluster's
nodes; while a 512-node gang starts, hundreds of passes would reduce the same unchanged objects
again, most of a pass's CPU. A view depends on nothing but the object, so one computed for a
resourceVersion stands until the object changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from trainium_operator.api.objects import Obj
from trainium_operator.lifecycle.observed import NodeView, PodView, node_view, pod_view

V = TypeVar("V")
# Objects remembered per kind before the memo starts over (it refills on the next passes): far
# more than the pods and nodes of the largest clusters the operator serves.
MEMO_LIMIT = 20_000


class _Memo(Generic[V]):
    def __init__(self, reduce: Callable[[Obj], V], limit: int) -> None:
        self._reduce = reduce
        self._limit = limit
        self._views: dict[str, tuple[str, V]] = {}

    def __call__(self, obj: Obj) -> V:
        meta = obj.get("metadata") or {}
        version = meta.get("resourceVersion")
        if not version:
            return self._reduce(obj)
        # A resourceVersion names one version of one object of its kind: a pod created again
        # under the same name has a new one.
        key = f"{meta.get('namespace') or ''}/{meta.get('name')}"
        # Passes of different jobs run in several threads: a race computes a view twice, the
        # same view, and each dict operation is atomic.
        known = self._views.get(key)
        if known is not None and known[0] == version:
            return known[1]
        view = self._reduce(obj)
        if len(self._views) >= self._limit:
            self._views = {}  # deleted objects' views go with it
        self._views[key] = (version, view)
        return view

    def __len__(self) -> int:
        return len(self._views)


class Views:
    """Memoised `pod_view` and `node_view`, for `lifecycle.observed.observe`."""

    def __init__(self, limit: int = MEMO_LIMIT) -> None:
        self.pod: _Memo[PodView | None] = _Memo(pod_view, limit)
        self.node: _Memo[NodeView] = _Memo(node_view, limit)

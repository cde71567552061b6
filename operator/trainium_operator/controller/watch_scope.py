"""Which namespaces the operator watches: names, or glob patterns such as `team-*`.

Names are watched one by one (a namespaced Role is enough). A pattern matches namespaces that
may not exist yet, so any pattern makes the watches cluster-wide, filtered on our side, as
kopf does for its own handlers with the same patterns.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence
from dataclasses import dataclass

GLOB_CHARACTERS = frozenset("*?[")


def is_pattern(namespace: str) -> bool:
    return any(char in GLOB_CHARACTERS for char in namespace)


@dataclass(frozen=True)
class WatchScope:
    """`sources`: the namespaces to list and watch (None: all of them); `accepts`: whether an
    object of that namespace is ours (None: every object the sources return is)."""

    sources: tuple[str | None, ...]
    accepts: Callable[[str], bool] | None

    @property
    def clusterwide(self) -> bool:
        return self.sources == (None,)


def watch_scope(namespaces: Sequence[str]) -> WatchScope:
    if not namespaces:
        return WatchScope((None,), None)
    if not any(is_pattern(n) for n in namespaces):
        return WatchScope(tuple(dict.fromkeys(namespaces)), None)
    chosen = tuple(namespaces)

    def accepts(namespace: str) -> bool:
        return any(fnmatch.fnmatchcase(namespace, pattern) for pattern in chosen)

    return WatchScope((None,), accepts)

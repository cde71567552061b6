"""What the UI holds in memory, least recently used first out, within a byte budget.

Loaded profiles (their composed summaries and dashboard) and decoded ranks of the timeline
are entries with an estimated size. Adding one past the budget evicts the least recently used
others until the total fits again; each eviction is reported to its owner (`on_evict`), which
drops what it held (an evicted profile is unloaded and loads again from the summary cache).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

from trainium_operator.ui.limits import DEFAULT_MEMORY_BUDGET

__all__ = ["DEFAULT_MEMORY_BUDGET", "MemoryLRU", "OverBudgetError"]


class OverBudgetError(MemoryError):
    """One entry alone would not fit in the memory budget."""


class MemoryLRU:
    def __init__(self, budget: int, on_evict: Callable[[Hashable, Any], None] | None = None):
        self.budget = budget
        self.on_evict = on_evict
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self.total = 0

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        found = self._entries.get(key)
        if found is None:
            return None
        self._entries.move_to_end(key)
        return found[0]

    def check(self, size: int, what: str) -> None:
        """Refuses, before anything is decoded, an entry that could never fit."""
        if size > self.budget:
            raise OverBudgetError(
                f"{what} needs about {size >> 20} MiB, more than the UI's memory budget of "
                f"{self.budget >> 20} MiB (profile serve --memory-budget)"
            )

    def put(self, key: Hashable, value: Any, size: int) -> None:
        self.pop(key)
        self._entries[key] = (value, size)
        self.total += size
        while self.total > self.budget and len(self._entries) > 1:
            old_key, (old_value, old_size) = self._entries.popitem(last=False)
            self.total -= old_size
            if self.on_evict is not None:
                self.on_evict(old_key, old_value)

    def pop(self, key: Hashable) -> Any | None:
        found = self._entries.pop(key, None)
        if found is None:
            return None
        self.total -= found[1]
        return found[0]

    def drop_where(self, predicate: Callable[[Hashable], bool]) -> int:
        """Removes (without `on_evict`) every entry whose key matches."""
        keys = [key for key in self._entries if predicate(key)]
        for key in keys:
            self.pop(key)
        return len(keys)

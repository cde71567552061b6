"""Every test gets exactly one tier, and a run goes unit -> integration -> e2e, chaos last."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

import tiers


@dataclass
class FakeItem:
    nodeid: str
    marks: tuple[str, ...] = ()
    fixturenames: tuple[str, ...] = ()
    added: list[str] = field(default_factory=list)

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.marks or name in self.added else None

    def add_marker(self, name: str) -> None:
        self.added.append(name)


def test_an_unmarked_test_without_the_cluster_is_unit_and_one_using_it_is_integration() -> None:
    assert tiers.tier_of(FakeItem("a", fixturenames=("tmp_path",))) == "unit"  # type: ignore[arg-type]
    assert tiers.tier_of(FakeItem("b", fixturenames=("dev_cluster",))) == "integration"  # type: ignore[arg-type]


def test_an_explicit_tier_wins_and_two_tiers_are_refused() -> None:
    assert tiers.tier_of(FakeItem("a", marks=("e2e",), fixturenames=("dev_cluster",))) == "e2e"  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="several tiers"):
        tiers.tier_of(FakeItem("b", marks=("unit", "integration")))  # type: ignore[arg-type]


def test_a_run_goes_tier_by_tier_with_the_chaos_tests_last_among_the_integration_ones() -> None:
    items = [
        FakeItem("e2e", marks=("e2e",)),
        FakeItem("chaos", marks=("chaos",), fixturenames=("dev_cluster",)),
        FakeItem("cluster", fixturenames=("dev_cluster",)),
        FakeItem("pure"),
    ]
    tiers.pytest_collection_modifyitems(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == ["pure", "cluster", "chaos", "e2e"]
    assert [i.added for i in items] == [["unit"], ["integration"], ["integration"], []]

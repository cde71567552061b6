"""Test tiers, as a pytest plugin (tests/conftest.py loads it).

Every test gets exactly one tier marker, so `pytest -m unit`, `-m integration` and `-m e2e`
together run what plain `pytest` runs:
- e2e: marked so explicitly (the README's fresh clone, full training runs);
- integration: marked so, or using the dev cluster (the real API server and Volcano);
- unit: everything else (no cluster: pure functions, builders, the state machine, the
  reconciler against a fake cluster, the UI and profiler on local files).

A run goes tier by tier (unit first: the quickest verdict), with the chaos tests last among the
integration tests, and ends with each tier's wall time, which `.ci/run` shows as its phases.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

TIERS = ("unit", "integration", "e2e")
_tier_of: dict[str, str] = {}
_started: dict[str, float] = {}
_seconds: Counter[str] = Counter()
_counts: Counter[str] = Counter()


def tier_of(item: pytest.Item) -> str:
    explicit = [tier for tier in TIERS if item.get_closest_marker(tier)]
    if len(explicit) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked with several tiers: {explicit}")
    if explicit:
        return explicit[0]
    return "integration" if "dev_cluster" in getattr(item, "fixturenames", ()) else "unit"


def _order(item: pytest.Item) -> tuple[int, bool]:
    # The chaos tests crash the API server: they run last, so the backoff that leaves in the
    # control plane's own clients and KWOK's controller (up to a minute) slows no other test.
    return TIERS.index(_tier_of[item.nodeid]), item.get_closest_marker("chaos") is not None


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        _tier_of[item.nodeid] = tier
        if not item.get_closest_marker(tier):
            item.add_marker(tier)
    items.sort(key=_order)


def pytest_runtest_logstart(nodeid: str) -> None:
    _started[nodeid] = time.monotonic()


def pytest_runtest_logfinish(nodeid: str) -> None:
    tier = _tier_of.get(nodeid)
    started = _started.pop(nodeid, None)
    if tier is not None and started is not None:
        _seconds[tier] += time.monotonic() - started
        _counts[tier] += 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _counts:
        return
    terminalreporter.section("time per tier")
    for tier in TIERS:
        if _counts[tier]:
            terminalreporter.write_line(
                f"{tier:<12} {_seconds[tier]:7.1f} s  ({_counts[tier]} tests)"
            )

"""The hostile-tenant tier: a TrainingJob author who controls everything their pods do, played
against the chart's defaults on the real cluster (docs/security.md, "Threat model").

Every test here is marked `hostile` (and is an integration test: it uses the dev cluster) and
records what it tried and what the cluster and the operator made of it through `hostile_report`;
the session's lines land in artifacts/hostile-report.txt, which `.ci/run` prints.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from integration.operator_harness import publish_report


@dataclass
class HostileReport:
    """What the tier tried, one line per attempt: the path (a field, an endpoint, a file), what
    was sent, and the outcome seen (refused with which message, or what ran with which rights)."""

    lines: list[str] = field(default_factory=list)

    def tried(self, path: str, attempt: str, outcome: str) -> None:
        self.lines.append(f"{path:<44} {attempt:<48} -> {outcome}")


_REPORT = HostileReport()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/hostile/" in str(item.path).replace("\\", "/"):
            item.add_marker(pytest.mark.hostile)


@pytest.fixture(scope="session")
def hostile_report() -> Iterator[HostileReport]:
    yield _REPORT
    publish_report(
        "hostile",
        ["hostile-tenant tier: what a job author tried, and what came of it", *_REPORT.lines],
    )

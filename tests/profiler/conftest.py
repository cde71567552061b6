"""The profiler is process-global: make sure no test leaves it running."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from trainium_operator import profiler


@pytest.fixture(autouse=True)
def _no_profiler_left_running() -> Iterator[None]:
    yield
    profiler.stop_profiling(wait=True, timeout=30)

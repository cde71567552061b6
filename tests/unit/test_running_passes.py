"""What a SIGTERM waits for: the reconcile passes still running in worker threads."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from trainium_operator.controller.wiring import RunningPasses


def blocked_pass(passes: RunningPasses, name: str) -> tuple[threading.Thread, threading.Event]:
    """A pass of ("ns", name) running in its own thread until the event is set."""
    release = threading.Event()
    worker = threading.Thread(target=passes.run, args=(("ns", name), lambda: release.wait(5)))
    worker.start()
    while not passes.keys():
        time.sleep(0.001)
    return worker, release


def test_a_pass_that_ends_within_the_grace_is_waited_for() -> None:
    passes = RunningPasses()
    worker, release = blocked_pass(passes, "a")
    threading.Timer(0.1, release.set).start()
    assert asyncio.run(passes.wait(3.0)) == []
    worker.join(1)


def test_a_pass_still_running_after_the_grace_is_named_not_waited_for() -> None:
    passes = RunningPasses()
    worker, release = blocked_pass(passes, "stuck")
    started = time.monotonic()
    assert asyncio.run(passes.wait(0.2)) == [("ns", "stuck")]
    assert time.monotonic() - started < 1.0
    release.set()
    worker.join(1)
    assert passes.keys() == []


def test_a_pass_that_raises_is_no_longer_running() -> None:
    passes = RunningPasses()

    def fail() -> float | None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        passes.run(("ns", "a"), fail)
    assert passes.keys() == []

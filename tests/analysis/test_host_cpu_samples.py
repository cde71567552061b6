"""Host CPU in a profile shaped like the dev-cluster demo's: a run of a couple of seconds under
the real profiler and sampler, with its step window never reached (the sampler idles at its
slow interval), analysed as `profile report` and the dashboard do.

The whole host runs at least the training process, so its busy cores can never read below the
process's; and the host's samples span the run, so the utilisation chart has a host line over
time instead of two points at the very end."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from profiler.profiler_helpers import start, stop_and_read
from trainium_operator import profiler
from trainium_operator.analysis.loading import load_profile
from trainium_operator.analysis.report import dashboard
from trainium_operator.profiler.config import StepWindow
from trainium_operator.profiler.manifest import ProfileManifest, write_manifest

RUN_S = 2.2  # shorter than the sampler's idle interval (2 s) plus its node interval (1 s)


def busy_demo_like_profile(root: Path) -> tuple[Path, int]:
    """The profile, and the CPU time the process used while it recorded."""
    cpu_before = time.process_time_ns()
    rank_file = start(
        root,
        steps=StepWindow(10_000, 10_001),  # like the demo's 10:14 outside its first seconds
        sample_interval_s=0.2,  # the default: the sampler idles at 2 s outside the window
    )
    step, deadline = 0, time.monotonic() + RUN_S
    while time.monotonic() < deadline:  # one busy core, as a CPU training rank is
        profiler.step(step)
        step += 1
        until = time.monotonic() + 0.05
        while time.monotonic() < until:
            sum(range(500))
    stop_and_read(rank_file)
    cpu_used_ns = time.process_time_ns() - cpu_before
    write_manifest(root, ProfileManifest(job_name="demo", namespace="default", finished=True))
    return root, cpu_used_ns


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], int]:
    """The dashboard of one recorded run (both tests read it: a run takes seconds), and the
    CPU time the process used while it recorded."""
    root, cpu_used_ns = busy_demo_like_profile(tmp_path_factory.mktemp("host-cpu") / "p")
    return dashboard(load_profile(root, workers=1)), cpu_used_ns


def test_the_whole_host_reads_at_least_the_training_process_it_runs(
    recorded: tuple[dict[str, Any], int],
) -> None:
    data, cpu_used_ns = recorded

    [cpu] = data["cpu"]
    # Every interval the sampler measured counts, its first included: the samples account
    # for the CPU the process used (start-up and stop around them aside).
    assert cpu["process_active_ns"] >= 0.8 * cpu_used_ns, (cpu, cpu_used_ns)
    # The host's busy time includes the process's own (tick rounding aside).
    assert cpu["host_active_ns"] >= 0.8 * cpu_used_ns, (cpu, cpu_used_ns)
    assert cpu["host_mean_cores"] >= 0.9 * cpu["process_mean_cores"], cpu
    assert cpu["process_mean_cores"] > 0.2, cpu


def test_the_utilisation_chart_has_host_cpu_over_the_whole_run(
    recorded: tuple[dict[str, Any], int],
) -> None:
    data, _ = recorded

    [host] = data["utilisation"]["node_cpu_cores"]
    drawn = [v for v in host if v is not None and not math.isnan(v)]
    assert len(drawn) >= 0.9 * len(host), f"{len(drawn)} of {len(host)} buckets have host CPU"
    first_half = np.array(drawn[: len(drawn) // 2])
    assert first_half.mean() > 0.2, "the host was busy from the start"

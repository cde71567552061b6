"""Settings from the environment the operator sets, and from code."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainium_operator.profiler.config import (
    ProfilerConfig,
    ProfilerConfigError,
    StepWindow,
)

BASE = {
    "TRAINIUM_PROFILE": "1",
    "TRAINIUM_PROFILE_DIR": "/shared/profiles/ml/llama/3",
    "TRAINIUM_PROFILE_STEPS": "10:20",
    "TRAINIUM_NODE_NAME": "ip-10-0-0-1.ec2.internal",
    "RANK": "37",
    "LOCAL_RANK": "5",
    "GROUP_RANK": "1",
    "WORLD_SIZE": "64",
}


def test_operator_environment_gives_identity_window_and_rank_file() -> None:
    config = ProfilerConfig.from_env(BASE)
    assert config.enabled
    assert config.steps == StepWindow(10, 20)
    assert (config.rank, config.local_rank, config.group_rank, config.world_size) == (37, 5, 1, 64)
    assert (config.namespace, config.job_name, config.attempt) == ("ml", "llama", 3)
    assert config.rank_file == Path(
        "/shared/profiles/ml/llama/3/ip-10-0-0-1.ec2.internal/rank-37.trnprof"
    )
    assert config.sources == frozenset({"torch", "neuron"})


def test_explicit_job_identity_wins_over_the_path() -> None:
    env = {**BASE, "TRAINIUM_JOB_NAME": "other", "TRAINIUM_JOB_UID": "u-1", "TRAINIUM_ATTEMPT": "0"}
    config = ProfilerConfig.from_env(env)
    assert (config.job_name, config.job_uid, config.attempt) == ("other", "u-1", 0)


def test_every_malformed_variable_is_reported_at_once() -> None:
    env = {
        **BASE,
        "TRAINIUM_PROFILE_STEPS": "20:10",
        "RANK": "seven",
        "TRAINIUM_PROFILE_RING_EVENTS": "1000",
        "TRAINIUM_PROFILE_SOURCES": "torch,cuda",
    }
    with pytest.raises(ProfilerConfigError) as excinfo:
        ProfilerConfig.from_env(env)
    message = str(excinfo.value)
    for fragment in ("TRAINIUM_PROFILE_STEPS", "RANK='seven'", "power of two", "cuda"):
        assert fragment in message
    assert len(excinfo.value.problems) == 4


def test_profiling_on_without_a_directory_is_an_error() -> None:
    env = {k: v for k, v in BASE.items() if k != "TRAINIUM_PROFILE_DIR"}
    with pytest.raises(ProfilerConfigError, match="no output directory"):
        ProfilerConfig.from_env(env)


def test_profiling_off_ignores_the_rest_of_the_environment() -> None:
    config = ProfilerConfig.from_env({"TRAINIUM_PROFILE": "0", "RANK": "garbage"})
    assert not config.enabled


def test_unknown_enable_value_is_an_error() -> None:
    with pytest.raises(ProfilerConfigError, match="TRAINIUM_PROFILE='maybe'"):
        ProfilerConfig.from_env({**BASE, "TRAINIUM_PROFILE": "maybe"})


def test_single_step_window_and_no_sources() -> None:
    config = ProfilerConfig.from_env(
        {**BASE, "TRAINIUM_PROFILE_STEPS": "7", "TRAINIUM_PROFILE_SOURCES": "none"}
    )
    assert config.steps == StepWindow(7, 7)
    assert config.sources == frozenset()


def test_rank_outside_world_and_bad_node_name_are_rejected_in_code() -> None:
    with pytest.raises(ProfilerConfigError) as excinfo:
        ProfilerConfig(output_dir=Path("/p"), rank=4, world_size=4, node="a/b")
    assert len(excinfo.value.problems) == 2

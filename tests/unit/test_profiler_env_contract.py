"""The profiler's env contract round trip: the env the operator builds for a training pod, read
back by the profiler inside that pod, gives the directory, window and identity the operator
meant (as tests/training checks the script against the operator's flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainium_operator.builders import pods
from trainium_operator.builders.job import Stage
from trainium_operator.contract import profiler_env
from trainium_operator.profiler.config import ProfilerConfig, StepWindow
from unit.jobs import job_ref


def pod_environment(pod: dict[str, Any], node: str, rank: int, world: int) -> dict[str, str]:
    """The container env as the kubelet and torchrun make it: downward-API fields resolved,
    torchrun's rank identity added."""
    env: dict[str, str] = {}
    for var in pod["spec"]["containers"][0]["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        elif var.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            env[var["name"]] = node
    env.update(RANK=str(rank), LOCAL_RANK=str(rank % 32), GROUP_RANK="1", WORLD_SIZE=str(world))
    return env


def test_the_profiler_reads_back_what_the_operator_sets() -> None:
    job = job_ref(profile={"enabled": True, "startStep": 7, "endStep": 12})
    pod = pods.pod(job, Stage.TRAIN, attempt=3, rank=1)
    env = pod_environment(pod, node="ip-10-0-1-7.ec2.internal", rank=40, world=64)
    config = ProfilerConfig.from_env(env)

    assert config.enabled
    assert config.output_dir == Path(job.profile_dir(3))
    assert config.steps == StepWindow(7, 12)
    assert config.node == "ip-10-0-1-7.ec2.internal"
    assert (config.job_name, config.namespace, config.job_uid) == (job.name, job.namespace, job.uid)
    assert config.attempt == 3
    assert (config.rank, config.world_size, config.group_rank) == (40, 64, 1)
    assert config.rank_file == Path(job.profile_dir(3)) / "ip-10-0-1-7.ec2.internal/rank-40.trnprof"


def test_every_name_the_operator_sets_for_the_profiler_is_in_the_contract() -> None:
    job = job_ref(profile={"enabled": True})
    names = {
        e["name"]
        for e in pods.pod(job, Stage.TRAIN, attempt=0, rank=0)["spec"]["containers"][0]["env"]
    }
    from trainium_operator.contract import workload_env

    # Every TRAINIUM_ name is either the workload contract's (contract/workload_env.py) or the
    # profiler's, and the profiler's all reach the pod.
    ours = {n for n in names if n.startswith("TRAINIUM_")}
    assert ours - set(workload_env.WORKLOAD_ENV_NAMES) == {
        profiler_env.ENABLE,
        profiler_env.DIR,
        profiler_env.STEPS,
    }
    assert set(profiler_env.OPERATOR_SET) <= ours


def test_profiling_is_off_in_pods_of_unprofiled_jobs_and_compile_pods() -> None:
    unprofiled = pods.pod(job_ref(), Stage.TRAIN, attempt=0, rank=0)
    assert not ProfilerConfig.from_env(pod_environment(unprofiled, "n", 0, 1)).enabled
    compile_pod = pods.pod(job_ref(profile={"enabled": True}), Stage.COMPILE, attempt=0, rank=0)
    assert not ProfilerConfig.from_env(pod_environment(compile_pod, "n", 0, 1)).enabled


def test_a_native_device_profiled_pod_has_its_profiler_capture_neurons_window() -> None:
    job = job_ref(
        instanceType="trn2.48xlarge", profile={"enabled": True, "neuronDeviceProfile": True}
    )
    pod = pods.pod(job, Stage.TRAIN, attempt=0, rank=0)
    config = ProfilerConfig.from_env(pod_environment(pod, node="ip-1", rank=0, world=128))
    assert config.neuron_device
    assert config.steps == StepWindow(10, 20)
    plain = pods.pod(
        job_ref(instanceType="trn2.48xlarge", profile={"enabled": True}), Stage.TRAIN, 0, 0
    )
    assert not ProfilerConfig.from_env(pod_environment(plain, "ip-1", 0, 128)).neuron_device

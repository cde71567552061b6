"""The environment every compile and training container gets: the workload contract.

The operator appends no argument the spec did not ask for (see `spec.TrainingCommand`), so a
script learns about its run from these variables instead: which job, stage and attempt it
is, how many gang restarts came before, whether it should resume from its last checkpoint,
and where its data and outputs go. The builder (`builders.pods`) writes them and
`read_workload_env` reads them back, and a test round-trips one through the other.

Standard library only: the training image imports this module without our dependencies.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

JOB_NAME = "TRAINIUM_JOB_NAME"
JOB_NAMESPACE = "TRAINIUM_JOB_NAMESPACE"
JOB_UID = "TRAINIUM_JOB_UID"
STAGE = "TRAINIUM_STAGE"  # compile | train
ATTEMPT = "TRAINIUM_ATTEMPT"  # the gang's attempt number, 0 for the first gang
RESTART_COUNT = "TRAINIUM_RESTART_COUNT"  # gang restarts before this gang (all classes)
RESUME = "TRAINIUM_RESUME"  # "1" when this gang should continue from a checkpoint, else "0"
OUTPUT_DIR = "TRAINIUM_OUTPUT_DIR"  # checkpoints and metrics, on the shared volume
DATA_DIR = "TRAINIUM_DATA_DIR"  # the training data, on the shared volume
COMPILE_STEPS = "TRAINIUM_COMPILE_STEPS"  # compile stage only: spec.compile.steps
NODE_NAME = "TRAINIUM_NODE_NAME"  # the Kubernetes node (downward API)
NODE_RANK = "TRAINIUM_NODE_RANK"  # the pod's node rank, 0..nodes-1 (torchrun's GROUP_RANK)
PRECISION = "TRAINIUM_PRECISION"  # bf16 | fp32

WORKLOAD_ENV_NAMES = (
    JOB_NAME,
    JOB_NAMESPACE,
    JOB_UID,
    STAGE,
    ATTEMPT,
    RESTART_COUNT,
    RESUME,
    OUTPUT_DIR,
    DATA_DIR,
    COMPILE_STEPS,
    NODE_NAME,
    NODE_RANK,
    PRECISION,
)


@dataclass(frozen=True, slots=True)
class WorkloadEnv:
    """What a script can know about its run, parsed from the container's environment."""

    job_name: str
    namespace: str
    uid: str
    stage: str
    node_rank: int
    attempt: int
    restart_count: int
    resume: bool
    output_dir: str
    data_dir: str
    compile_steps: int | None
    node_name: str | None
    precision: str | None


def read_workload_env(environ: Mapping[str, str] | None = None) -> WorkloadEnv:
    """The run's identity from the environment (os.environ by default); KeyError names a
    missing variable, so a script started outside a TrainingJob fails clearly."""
    env = os.environ if environ is None else environ
    steps = env.get(COMPILE_STEPS)
    return WorkloadEnv(
        job_name=env[JOB_NAME],
        namespace=env[JOB_NAMESPACE],
        uid=env[JOB_UID],
        stage=env[STAGE],
        node_rank=int(env[NODE_RANK]),
        attempt=int(env[ATTEMPT]),
        restart_count=int(env[RESTART_COUNT]),
        resume=env[RESUME] == "1",
        output_dir=env[OUTPUT_DIR],
        data_dir=env[DATA_DIR],
        compile_steps=int(steps) if steps else None,
        node_name=env.get(NODE_NAME),
        precision=env.get(PRECISION),
    )

"""The environment every compile and training container gets: the workload contract.

The operator appends no argument the spec did not ask for (see `spec.TrainingCommand`), so a
script learns about its run from these variables instead: which job, stage and attempt it
is, how many gang restarts came before, whether it should resume from its last checkpoint,
and where its data and outputs go. The builder (`builders.pods`) writes them and
`read_workload_env` reads them back, and a test round-trips one through the other.

Attempts never share a write path: each gang writes only under its own
attempt's directory of the job's output root (`attempt_output_dir`), and a resuming gang reads
the earlier attempts' directories (`training_attempt_dirs`) without writing there. A gang of an
earlier attempt that still runs (its node was only partitioned) can then never change what a
later gang resumed from or writes.

Standard library only: the training image imports this module without our dependencies.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

JOB_NAME = "TRAINIUM_JOB_NAME"
JOB_NAMESPACE = "TRAINIUM_JOB_NAMESPACE"
JOB_UID = "TRAINIUM_JOB_UID"
STAGE = "TRAINIUM_STAGE"  # compile | train
ATTEMPT = "TRAINIUM_ATTEMPT"  # the gang's attempt number, 0 for the first gang
RESTART_COUNT = "TRAINIUM_RESTART_COUNT"  # gang restarts before this gang (all classes)
RESUME = "TRAINIUM_RESUME"  # "1" when this gang should continue from a checkpoint, else "0"
# Where this gang writes its checkpoints and metrics: its own attempt's directory of the output
# root (attempt_output_dir), never shared with another gang. Also the value of outputDirArg.
OUTPUT_DIR = "TRAINIUM_OUTPUT_DIR"
# The job's output root (spec.outputDir or <mountPath>/output/<namespace>/<job>): the earlier
# attempts' directories are under it. Read it to resume; write only under OUTPUT_DIR.
OUTPUT_ROOT = "TRAINIUM_OUTPUT_ROOT"
DATA_DIR = "TRAINIUM_DATA_DIR"  # the training data, on the shared volume
COMPILE_STEPS = "TRAINIUM_COMPILE_STEPS"  # compile stage only: spec.compile.steps
NODE_NAME = "TRAINIUM_NODE_NAME"  # the Kubernetes node (downward API)
NODE_RANK = "TRAINIUM_NODE_RANK"  # the pod's node rank, 0..nodes-1 (torchrun's GROUP_RANK)
PRECISION = "TRAINIUM_PRECISION"  # bf16 | fp32
# Which Neuron PyTorch stack the container runs: "xla" (torch-neuronx with PyTorch/XLA, trn1)
# or "native" (TorchNeuron, device "neuron", trn2/trn3). The training image's device layer
# picks its code path from it; absent means "xla", what images built before it was set ran.
NEURON_STACK = "TRAINIUM_NEURON_STACK"
NEURON_STACKS = ("xla", "native")
DEFAULT_NEURON_STACK = "xla"

WORKLOAD_ENV_NAMES = (
    JOB_NAME,
    JOB_NAMESPACE,
    JOB_UID,
    STAGE,
    ATTEMPT,
    RESTART_COUNT,
    RESUME,
    OUTPUT_DIR,
    OUTPUT_ROOT,
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
    output_root: str
    data_dir: str
    compile_steps: int | None
    node_name: str | None
    precision: str | None
    neuron_stack: str = DEFAULT_NEURON_STACK


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
        output_root=env[OUTPUT_ROOT],
        data_dir=env[DATA_DIR],
        compile_steps=int(steps) if steps else None,
        node_name=env.get(NODE_NAME),
        precision=env.get(PRECISION),
        neuron_stack=env.get(NEURON_STACK) or DEFAULT_NEURON_STACK,
    )


# -- the per-attempt layout of the output root --------------------------------------------------
TRAIN_ATTEMPT_PREFIX = "attempt-"  # <root>/attempt-<N>: training gang N; resumes read these
COMPILE_ATTEMPT_PREFIX = "compile-"  # <root>/compile-<N>: compile gang N; nothing reads these
_TRAIN_ATTEMPT_NAME = re.compile(rf"^{TRAIN_ATTEMPT_PREFIX}(0|[1-9][0-9]*)$")


def attempt_output_dir(root: str, stage: str, attempt: int) -> str:
    """The one directory gang `attempt` of `stage` writes under: its own, never another's.

    Compile and training gangs may share an attempt number (training starts at the attempt its
    compile stage ended with), so the stage is part of the name too.
    """
    prefix = COMPILE_ATTEMPT_PREFIX if stage == "compile" else TRAIN_ATTEMPT_PREFIX
    return f"{root.rstrip('/')}/{prefix}{attempt}"


def training_attempt_of(name: str) -> int | None:
    """The attempt number of a training attempt's directory name, None for any other name."""
    match = _TRAIN_ATTEMPT_NAME.match(name)
    return int(match.group(1)) if match else None


def training_attempt_dirs(root: Path) -> list[tuple[int, Path]]:
    """The training attempts' directories under `root`, by attempt number, lowest first."""
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        attempt = training_attempt_of(entry.name)
        if attempt is not None and entry.is_dir():
            found.append((attempt, entry))
    return sorted(found, key=lambda pair: pair[0])

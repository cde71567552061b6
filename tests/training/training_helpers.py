"""Helpers of the training workload tests: paths, child environments, subprocess runs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TRAINING_ROOT = REPO / "images" / "training"
PRETRAIN = TRAINING_ROOT / "trainium_training" / "pretrain.py"
MAKE_SHARDS = TRAINING_ROOT / "trainium_training" / "make_shards.py"
CHECK_SHARDS = TRAINING_ROOT / "trainium_training" / "check_shards.py"

RUN_TIMEOUT_S = 300


def child_env(**overrides: str) -> dict[str, str]:
    """The test's environment without settings that change a training run's behaviour."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINIUM_", "NEURON_", "PJRT_", "XLA_"))
        and k not in {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(overrides)
    return env


def torchrun_argv(nproc: int, script_args: Sequence[str]) -> list[str]:
    # --standalone: a local rendezvous on a free port, so parallel runs cannot collide.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(PRETRAIN),
        *script_args,
    ]


def run(argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(argv),
        env=env or child_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )

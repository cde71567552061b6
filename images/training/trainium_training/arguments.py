"""Command-line arguments of pretrain.py, checked as a whole.

Names and defaults follow the reference tutorial's script where it has them (batch 8,
accumulation 64, 28,125 steps, 2,000 warmup steps, lr 4e-4, seed 12349). The flags the
operator appends come from `trainium_operator.contract.training_flags`, so both sides share one
spelling.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from trainium_operator.contract.training_flags import (
    DATA_DIR_FLAG,
    OUTPUT_DIR_FLAG,
    RESUME_FLAG,
    STEPS_THIS_RUN_FLAG,
)
from trainium_training.choices import (
    COMPILE_BACKEND_CHOICES,
    DEFAULT_MODEL_CONFIG,
    DEVICE_CHOICES,
    MODEL_CONFIGS,
    OPTIMIZERS,
)

PRECISION_CHOICES: Final = ("auto", "bf16", "fp32")
PRECISION_ENV: Final = "TRAINIUM_PRECISION"
"""Set by the operator from the TrainingJob's spec.precision; --precision overrides it."""


@dataclass(frozen=True)
class TrainingArguments:
    data_dir: Path
    output_dir: Path
    model_config: str
    optimizer: str
    batch_size: int
    grad_accum_usteps: int
    max_steps: int
    steps_this_run: int
    warmup_steps: int
    lr: float
    weight_decay: float
    max_grad_norm: float
    seed: int
    seq_len: int | None
    max_pred_len: int | None
    checkpoint_every_steps: int
    num_ckpts_to_keep: int
    checkpoint_load_concurrency: int
    log_every_steps: int
    resume: bool
    device: str
    precision: str
    compile_backend: str = "auto"

    def as_record(self) -> dict[str, Any]:
        """Plain values, for checkpoints and logs."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def _flag(name: str) -> str:
    return name.removeprefix("--")


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="pretrain.py",
        description="BERT phase-1 pretraining on HDF5 shards (Trainium via torch-xla, or CPU).",
    )
    data = parser.add_argument_group("data and outputs")
    data.add_argument(
        DATA_DIR_FLAG,
        dest=_flag(DATA_DIR_FLAG),
        type=Path,
        required=True,
        help="folder of *_training_*.hdf5 shards (the tutorial's wikicorpus format)",
    )
    data.add_argument(
        OUTPUT_DIR_FLAG,
        dest=_flag(OUTPUT_DIR_FLAG),
        type=Path,
        default=Path("output"),
        help="checkpoints/, metrics.jsonl and tensorboard/ go here (a shared volume)",
    )
    data.add_argument("--seq_len", type=int, default=None, help="if set, must match the data")
    data.add_argument(
        "--max_pred_len", type=int, default=None, help="if set, must match the data's width"
    )

    model = parser.add_argument_group("model and optimisation")
    model.add_argument(
        "--model_config", choices=sorted(MODEL_CONFIGS), default=DEFAULT_MODEL_CONFIG
    )
    model.add_argument(
        "--optimizer", type=str.lower, choices=OPTIMIZERS, default="adamw", help="adamw or lamb"
    )
    model.add_argument("--batch_size", type=int, default=8, help="sequences per micro-batch")
    model.add_argument(
        "--grad_accum_usteps", type=int, default=64, help="micro-batches per optimizer step"
    )
    model.add_argument("--max_steps", type=int, default=28125, help="optimizer steps in total")
    model.add_argument(
        STEPS_THIS_RUN_FLAG,
        dest=_flag(STEPS_THIS_RUN_FLAG),
        type=int,
        default=-1,
        help="stop after this many steps in this invocation (-1: run to --max_steps); "
        "the compile stage passes a few steps",
    )
    model.add_argument("--warmup_steps", type=int, default=2000)
    model.add_argument("--lr", type=float, default=4e-4, help="peak learning rate")
    model.add_argument("--weight_decay", type=float, default=0.01)
    model.add_argument("--max_grad_norm", type=float, default=1.0, help="clip the global norm")
    model.add_argument("--seed", type=int, default=12349)

    ckpt = parser.add_argument_group("checkpoints")
    ckpt.add_argument(
        "--checkpoint_every_steps", type=int, default=500, help="also written at the end"
    )
    ckpt.add_argument("--num_ckpts_to_keep", type=int, default=2)
    ckpt.add_argument(
        "--checkpoint_load_concurrency",
        type=int,
        default=16,
        help="ranks reading a checkpoint at once (bounds host memory and file-system load)",
    )
    ckpt.add_argument(
        RESUME_FLAG,
        dest=_flag(RESUME_FLAG),
        action="store_true",
        help="continue from the newest checkpoint in --output_dir (from scratch if none)",
    )

    runtime = parser.add_argument_group("runtime")
    runtime.add_argument("--log_every_steps", type=int, default=1)
    runtime.add_argument(
        "--device",
        choices=DEVICE_CHOICES,
        default="auto",
        help="auto = the Neuron device of the stack $TRAINIUM_NEURON_STACK names (xla or neuron) "
        "when present, else cpu",
    )
    runtime.add_argument(
        "--compile_backend",
        choices=COMPILE_BACKEND_CHOICES,
        default="auto",
        help="native stack: the torch.compile backend; auto = neuron on the Neuron device, off "
        "(eager) on the CPU",
    )
    runtime.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        default=env.get(PRECISION_ENV) or "auto",
        help=f"auto = bf16 on XLA, fp32 on CPU (default from ${PRECISION_ENV})",
    )
    return parser


def problems(args: TrainingArguments) -> list[str]:
    """Every inconsistency at once, each naming the flag and a valid value."""
    found = []

    def at_least(flag: str, value: float, low: float) -> None:
        if value < low:
            found.append(f"{flag} must be >= {low} (got {value})")

    at_least("--batch_size", args.batch_size, 1)
    at_least("--grad_accum_usteps", args.grad_accum_usteps, 1)
    at_least("--max_steps", args.max_steps, 1)
    at_least("--warmup_steps", args.warmup_steps, 0)
    at_least("--weight_decay", args.weight_decay, 0)
    at_least("--checkpoint_every_steps", args.checkpoint_every_steps, 1)
    at_least("--num_ckpts_to_keep", args.num_ckpts_to_keep, 1)
    at_least("--checkpoint_load_concurrency", args.checkpoint_load_concurrency, 1)
    at_least("--log_every_steps", args.log_every_steps, 1)
    if args.steps_this_run == 0 or args.steps_this_run < -1:
        found.append(
            f"{STEPS_THIS_RUN_FLAG} must be -1 (run to --max_steps) or >= 1 "
            f"(got {args.steps_this_run})"
        )
    if not args.lr > 0:
        found.append(f"--lr must be > 0 (got {args.lr})")
    if not args.max_grad_norm > 0:
        found.append(f"--max_grad_norm must be > 0 (got {args.max_grad_norm})")
    if args.seq_len is not None:
        limit = MODEL_CONFIGS[args.model_config].max_position_embeddings
        if not 2 <= args.seq_len <= limit:
            found.append(
                f"--seq_len must be in [2, {limit}] for --model_config {args.model_config} "
                f"(got {args.seq_len})"
            )
    if args.max_pred_len is not None:
        at_least("--max_pred_len", args.max_pred_len, 1)
    if args.precision not in PRECISION_CHOICES:
        found.append(
            f"--precision (or ${PRECISION_ENV}) must be one of {', '.join(PRECISION_CHOICES)} "
            f"(got {args.precision!r})"
        )
    if args.output_dir.exists() and not args.output_dir.is_dir():
        found.append(f"{OUTPUT_DIR_FLAG} {args.output_dir} exists and is not a directory")
    return found


def parse_arguments(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> TrainingArguments:
    """Parse and check; exits with status 2 and every problem listed on bad input."""
    parser = build_parser(environ)
    namespace = parser.parse_args(argv)
    args = TrainingArguments(**vars(namespace))
    found = problems(args)
    if found:
        parser.error("; ".join(found))
    return args

"""BERT phase-1 pretraining: the training workload that the operator runs under torchrun.

    torchrun --nproc_per_node 32 /opt/trainium/trainium_training/pretrain.py \\
        --batch_size 16 --grad_accum_usteps 32 --data_dir DATA --output_dir OUT

One step: for each of `--grad_accum_usteps` micro-batches load, forward, backward (graph cut
on XLA); then average gradients over ranks, clip the global norm, optimizer and LR-schedule
step. Rank 0 logs loss, learning rate, gradient norm, step time and sequences/s, and writes
checkpoints every `--checkpoint_every_steps` and at the end. With `--resume` the newest
checkpoint restores the model, optimizer, schedule, step and data position, and the per-step
RNG seeds are a function of (seed, rank, step), so a resumed run repeats what the
uninterrupted run would have done.

Under the operator (`TRAINIUM_OUTPUT_ROOT` set) `--output_dir` is this attempt's own directory,
`<root>/attempt-<N>`, and `--resume` starts from the newest complete checkpoint of the earlier
attempts' directories, never writing there (see `checkpoints.newest_of_earlier_attempts`). Run
by hand (no such variable), `--resume` continues from `--output_dir` itself.

Under neuron_parallel_compile (`NEURON_EXTRACT_GRAPHS_ONLY` set) the same steps run so the
same graphs are traced, but nothing is written: no checkpoint, no metrics, no TensorBoard.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from collections.abc import Mapping, MutableMapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

if __name__ == "__main__" and not __package__:
    # torchrun runs this file as a script: import the package from its parent folder rather
    # than letting this folder's modules shadow top-level ones.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

if __name__ == "__main__":
    # --help and a bad argument answer before torch and transformers are imported (seconds).
    from trainium_training.arguments import parse_arguments as _check_arguments

    _check_arguments(sys.argv[1:])

import numpy as np
import torch
from torch import nn

from trainium_operator import profiler
from trainium_operator.contract import workload_env
from trainium_operator.contract.training_flags import OUTPUT_DIR_FLAG
from trainium_training import checkpoints, data_stream, devices, metrics, shards
from trainium_training.arguments import TrainingArguments, parse_arguments
from trainium_training.choices import MODEL_CONFIGS
from trainium_training.model_configs import build_model
from trainium_training.optimizers import build_optimizer, build_scheduler

log = logging.getLogger("trainium_training")

ANNOTATE_STEP: Final = "step"
ANNOTATE_DATA: Final = "data_loading"
ANNOTATE_FORWARD: Final = "forward"
ANNOTATE_BACKWARD: Final = "backward"
ANNOTATE_OPTIMIZER: Final = "optimizer_step"


class RunError(RuntimeError):
    """The run cannot start or continue; the message says why and what to change."""


def step_seed(seed: int, rank: int, step: int) -> int:
    """The RNG seed of one rank's step: resumed runs draw the same dropout masks."""
    return int(np.random.SeedSequence([seed, rank, step]).generate_state(1)[0])


def resolve_precision(requested: str, device_kind: str) -> str:
    if requested == "auto":
        return "bf16" if device_kind in ("xla", devices.NEURON_DEVICE) else "fp32"
    return requested


def final_step(args: TrainingArguments, start_step: int) -> int:
    if args.steps_this_run == -1:
        return args.max_steps
    return min(args.max_steps, start_step + args.steps_this_run)


@dataclass
class Learner:
    """The model and what updates it."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


@dataclass
class TrainingState:
    """Everything a checkpoint restores, besides model, optimizer and schedule tensors."""

    step: int = 0
    micro_batches_consumed: int = 0


def checkpoint_payload(
    args: TrainingArguments,
    learner: Learner,
    state: TrainingState,
    *,
    plan: data_stream.ShardPlan,
    position: data_stream.DataPosition,
) -> dict[str, Any]:
    return {
        "format": checkpoints.FORMAT_NAME,
        "format_version": checkpoints.FORMAT_VERSION,
        "step": state.step,
        "model_config": args.model_config,
        "model": checkpoints.to_cpu(learner.model.state_dict()),
        "optimizer": checkpoints.to_cpu(learner.optimizer.state_dict()),
        "scheduler": learner.scheduler.state_dict(),
        "data": {
            "micro_batches_consumed": state.micro_batches_consumed,
            "world_size": plan.world_size,
            "batch_size": args.batch_size,
            "grad_accum_usteps": args.grad_accum_usteps,
            "shards": [p.name for p in plan.files],
            "rank0_position": position.as_dict(),
        },
        "rng": {"seed": args.seed, "scheme": "per-step seed from (seed, rank, step)"},
        "arguments": args.as_record(),
        "written_at": time.time(),
    }


def load_newest_checkpoint(
    args: TrainingArguments, backend: devices.Backend
) -> tuple[checkpoints.CheckpointFile, dict[str, Any]] | None:
    """All ranks read the newest checkpoint, `--checkpoint_load_concurrency` at a time."""
    newest = checkpoints.newest_checkpoint(checkpoints.checkpoint_dir(args.output_dir))
    if newest is None:
        return None
    concurrency = args.checkpoint_load_concurrency
    state: dict[str, Any] | None = None
    for wave in range(math.ceil(backend.world_size / concurrency)):
        if backend.rank // concurrency == wave:
            state = checkpoints.load(newest.path)
        backend.barrier(f"checkpoint-load-{wave}")
    assert state is not None
    return newest, state


def check_resumable(
    args: TrainingArguments, path: Path, saved: dict[str, Any], backend: devices.Backend
) -> None:
    if saved["model_config"] != args.model_config:
        raise checkpoints.CheckpointError(
            f"{path} was written for --model_config {saved['model_config']}, this run uses "
            f"{args.model_config}; pass --model_config {saved['model_config']} or a new "
            "--output_dir"
        )
    if saved["rng"]["seed"] != args.seed:
        raise checkpoints.CheckpointError(
            f"{path} was written with --seed {saved['rng']['seed']}, this run uses "
            f"{args.seed}; the data order depends on it, so pass --seed {saved['rng']['seed']} "
            "or a new --output_dir"
        )
    data = saved["data"]
    changed = [
        f"{name} {data[key]} -> {now}"
        for name, key, now in (
            ("world size", "world_size", backend.world_size),
            ("--batch_size", "batch_size", args.batch_size),
            ("--grad_accum_usteps", "grad_accum_usteps", args.grad_accum_usteps),
        )
        if data[key] != now
    ]
    if changed:
        log.warning(
            "resuming with %s: the data order from here differs from an uninterrupted run",
            ", ".join(changed),
        )
    before = saved["arguments"]
    retuned = [
        f"{flag} {before[key]} -> {now}"
        for flag, key, now in (
            ("--optimizer", "optimizer", args.optimizer),
            ("--lr", "lr", args.lr),
            ("--warmup_steps", "warmup_steps", args.warmup_steps),
            ("--max_steps", "max_steps", args.max_steps),
        )
        if before.get(key) != now
    ]
    if retuned:
        log.warning("resuming with %s: the run continues with the new values", ", ".join(retuned))


def restore(saved: dict[str, Any], learner: Learner, args: TrainingArguments) -> TrainingState:
    """Load model and optimizer state; rebuild the schedule at the saved step."""
    learner.model.load_state_dict(saved["model"])
    learner.optimizer.load_state_dict(saved["optimizer"])
    step = int(saved["step"])
    saved_schedule_step = int(saved["scheduler"]["last_epoch"])
    if saved_schedule_step != step:
        raise checkpoints.CheckpointError(
            f"checkpoint of step {step} holds a schedule at step {saved_schedule_step}: "
            "the file is inconsistent; delete it to resume from the previous one"
        )
    learner.scheduler = new_scheduler(learner.optimizer, args, completed_steps=step)
    return TrainingState(
        step=step, micro_batches_consumed=int(saved["data"]["micro_batches_consumed"])
    )


def new_scheduler(
    optimizer: torch.optim.Optimizer, args: TrainingArguments, completed_steps: int = 0
) -> torch.optim.lr_scheduler.LambdaLR:
    return build_scheduler(
        optimizer,
        peak_lr=args.lr,
        warmup_steps=args.warmup_steps,
        total_steps=args.max_steps,
        completed_steps=completed_steps,
    )


def verify_position(
    saved: dict[str, Any],
    plan: data_stream.ShardPlan,
    position: data_stream.DataPosition,
    args: TrainingArguments,
) -> None:
    """Rank 0's recomputed position must equal the saved one when nothing else changed."""
    data = saved["data"]
    same_layout = (
        data["world_size"] == plan.world_size
        and data["batch_size"] == args.batch_size
        and data["shards"] == [p.name for p in plan.files]
    )
    if same_layout and data["rank0_position"] != position.as_dict():
        raise checkpoints.CheckpointError(
            f"the checkpoint's data position {data['rank0_position']} differs from the one "
            f"recomputed from the shards ({position.as_dict()}): the shards' contents changed "
            "since it was written"
        )
    if data["shards"] != [p.name for p in plan.files]:
        log.warning("the shard list changed since the checkpoint: the data order will differ")


class Trainer:
    """The step loop over a backend; rank 0 reports."""

    def __init__(
        self,
        args: TrainingArguments,
        backend: devices.Backend,
        learner: Learner,
        *,
        stream: data_stream.RankDataStream,
        sink: metrics.MetricsSink,
    ) -> None:
        self.args = args
        self.backend = backend
        self.model = learner.model
        # What the step calls (DDP and torch.compile on the native stack); checkpoints keep
        # saving `model`, whose parameters it shares.
        self.step_model = backend.prepare_model(learner.model)
        self.optimizer = learner.optimizer
        self.scheduler = learner.scheduler
        self.stream = stream
        self.sink = sink
        self.params = [p for p in learner.model.parameters() if p.requires_grad]
        self.global_batch = args.batch_size * args.grad_accum_usteps * backend.world_size
        self.throughput = metrics.Throughput()

    def run_step(self, step: int) -> data_stream.DataPosition:
        """One optimizer step; returns the data position of its last micro-batch."""
        backend, accum = self.backend, self.args.grad_accum_usteps
        backend.seed(step_seed(self.args.seed, backend.rank, step))
        loss_sum = torch.zeros((), device=backend.device, dtype=torch.float32)
        position = self.stream.position
        for micro_batch in range(accum):
            with profiler.annotate(ANNOTATE_DATA):
                batch = next(self.stream)
                inputs = {k: backend.to_device(v) for k, v in batch.arrays().items()}
            with backend.accumulating(self.step_model, last=micro_batch == accum - 1):
                with profiler.annotate(ANNOTATE_FORWARD):
                    loss = self.step_model(**inputs).loss / accum
                with profiler.annotate(ANNOTATE_BACKWARD):
                    loss.backward()
                    loss_sum += loss.detach().float()
                    backend.mark_step()
            position = batch.position
        with profiler.annotate(ANNOTATE_OPTIMIZER):
            backend.reduce_gradients(self.optimizer)
            grad_norm = nn.utils.clip_grad_norm_(self.params, self.args.max_grad_norm)
            learning_rate = self.scheduler.get_last_lr()[0]
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            mean_loss = backend.mean_over_ranks(loss_sum)
            if step % self.args.log_every_steps == 0:
                # Registered before the graph cut so that, under XLA, it runs as soon as
                # this step's values exist (on the CPU it runs at once).
                backend.after_step(
                    self._report, (step, mean_loss, grad_norm, learning_rate, position)
                )
            backend.mark_step()
        return position

    def _report(
        self,
        step: int,
        loss: torch.Tensor,
        grad_norm: torch.Tensor,
        learning_rate: float,
        position: data_stream.DataPosition,
    ) -> None:
        elapsed = self.throughput.lap() / self.args.log_every_steps
        self.sink.record(
            metrics.StepMetrics(
                step=step,
                loss=float(loss.item()),
                learning_rate=float(learning_rate),
                grad_norm=float(grad_norm.item()),
                step_time_s=elapsed,
                sequences_per_s=self.global_batch / elapsed if elapsed > 0 else 0.0,
                global_batch=self.global_batch,
                world_size=self.backend.world_size,
                epoch=position.epoch,
                shard_round=position.round,
                shard_batch=position.batch,
                wall_time=time.time(),
            )
        )


def stop_profiler() -> None:
    """Stop capture and give the background writer a bounded time to finish the rank file."""
    if not profiler.stop_profiling(wait=True, timeout=60.0):
        log.warning("the profiler did not finish writing within 60 s; its file may be partial")


def configure_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(message)s",
        stream=sys.stderr,
        force=True,
    )


def run(args: TrainingArguments, environ: MutableMapping[str, str]) -> int:
    """Train from args; returns the step reached."""
    extraction = devices.graph_extraction_mode(environ)
    try:
        kind = devices.resolve_device(args.device, environ)
    except ValueError as exc:
        raise RunError(str(exc)) from None
    bf16 = resolve_precision(args.precision, kind) == "bf16"
    if kind == "xla":
        devices.prepare_neuron_environment(environ, bf16)
    elif kind == devices.NEURON_DEVICE:
        devices.prepare_native_environment(environ, bf16)
    try:
        backend = devices.create_backend(
            kind,
            environ,
            torch.bfloat16 if bf16 else torch.float32,
            compile_backend=args.compile_backend,
        )
    except (RuntimeError, ValueError) as exc:
        raise RunError(str(exc)) from exc
    configure_logging(backend.rank)
    try:
        return _train(args, backend, extraction, attempt_layout(args, environ))
    finally:
        backend.shutdown()


def attempt_layout(
    args: TrainingArguments, environ: Mapping[str, str]
) -> workload_env.WorkloadEnv | None:
    """The operator's run when --output_dir is this attempt's own directory: it then writes only
    there and resumes from the earlier attempts'. None when run by hand (no
    TRAINIUM_OUTPUT_ROOT) or given another directory: that one is written and resumed from, as
    the user asked."""
    if workload_env.OUTPUT_ROOT not in environ:
        return None
    run = workload_env.read_workload_env(environ)
    own = args.output_dir.absolute()
    if own == Path(run.output_dir):
        return run
    another = workload_env.training_attempt_of(own.name) is not None
    if own.parent == Path(run.output_root) and another:
        raise RunError(
            f"{OUTPUT_DIR_FLAG} {own} is another attempt's directory: attempt {run.attempt} "
            f"writes only its own, ${workload_env.OUTPUT_DIR} ({run.output_dir})"
        )
    log.warning(
        "%s %s is not this attempt's own directory ($%s, %s): a gang of an earlier attempt "
        "that still runs may write there too",
        OUTPUT_DIR_FLAG,
        own,
        workload_env.OUTPUT_DIR,
        run.output_dir,
    )
    return None


PREVIOUS_RUNS_SUBDIR: Final = "previous-runs"


def earlier_outputs(output_dir: Path) -> list[Path]:
    """The checkpoints, metrics and TensorBoard files a run leaves in its output directory."""
    names = (checkpoints.CHECKPOINT_SUBDIR, metrics.METRICS_FILE, metrics.TENSORBOARD_SUBDIR)
    return [output_dir / name for name in names if (output_dir / name).exists()]


def outputs_of_an_earlier_run(
    args: TrainingArguments, layout: workload_env.WorkloadEnv | None
) -> tuple[Path, list[Path]]:
    """What an earlier run left where this run writes or resumes from, and the folder whose
    previous-runs/ takes it. A run must not mix with them: a later resume would pick the
    earlier run's checkpoints.

    By hand, a run without --resume finds them in --output_dir (with --resume, that directory
    is what it continues). Under the operator, the job's first training gang that starts fresh
    moves aside every attempt directory of the output root: later attempts resume from those,
    and none is this job's (a job of the same name before it, or another job with the same
    outputDir, wrote them). Any other gang finds them in its own attempt directory, which a
    resume never reads.
    """
    if layout is None:
        return args.output_dir, [] if args.resume else earlier_outputs(args.output_dir)
    first_fresh_training = layout.stage == "train" and not layout.resume and not args.resume
    if first_fresh_training:
        root = Path(layout.output_root)
        return root, [directory for _, directory in workload_env.training_attempt_dirs(root)]
    return args.output_dir, earlier_outputs(args.output_dir)


def move_aside(folder: Path, present: Sequence[Path], now: float | None = None) -> Path | None:
    """Move `present` (entries of `folder`) into `folder/previous-runs/<UTC time>/`; nothing is
    deleted. Returns that archive folder, None when there was nothing to move."""
    if not present:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    archive = folder / PREVIOUS_RUNS_SUBDIR / stamp
    suffix = 0
    while archive.exists():
        suffix += 1
        archive = folder / PREVIOUS_RUNS_SUBDIR / f"{stamp}-{suffix}"
    archive.mkdir(parents=True)
    for path in present:
        path.rename(archive / path.name)
    return archive


def adopt_resume_point(
    layout: workload_env.WorkloadEnv, ckpt_dir: Path, tries: int = 3
) -> checkpoints.AttemptCheckpoint | None:
    """Rank 0: link the newest complete checkpoint of the earlier attempts into this attempt's
    own checkpoints, so every rank reads the same file and no earlier gang can take it away.
    An earlier gang still running may prune the chosen file meanwhile: then look again."""
    root = Path(layout.output_root)
    for _ in range(tries):
        found = checkpoints.newest_of_earlier_attempts(root, layout.attempt)
        if found is None:
            return None
        try:
            checkpoints.adopt(found.checkpoint, ckpt_dir)
        except FileNotFoundError:
            continue
        return found
    raise checkpoints.CheckpointError(
        f"the newest checkpoint under {root} vanished {tries} times while being taken: an "
        "earlier attempt's gang is still pruning there"
    )


def _train(
    args: TrainingArguments,
    backend: devices.Backend,
    extraction: bool,
    layout: workload_env.WorkloadEnv | None = None,
) -> int:
    rank0 = backend.rank == 0
    writes = rank0 and not extraction
    if extraction:
        log.info(
            "graph extraction (%s set): no checkpoint or metric is written",
            devices.GRAPH_EXTRACTION_ENV,
        )
    log.info(
        "device %s, world size %d, dtype %s, model %s, optimizer %s",
        backend.name,
        backend.world_size,
        backend.default_dtype(),
        args.model_config,
        args.optimizer,
    )
    log.info(
        "Neuron stack %s: torch device %s, process group %s, torch.compile %s",
        backend.stack,
        backend.device,
        backend.process_group_backend or "none (one process)",
        backend.compile_backend or "off",
    )
    shape = MODEL_CONFIGS[args.model_config]
    expect = shards.ShardExpectations(
        vocab_size=shape.vocab_size,
        max_seq_len=shape.max_position_embeddings,
        seq_len=args.seq_len,
        max_pred=args.max_pred_len,
        min_samples=args.batch_size,
    )
    plan = data_stream.ShardPlan(
        tuple(shards.list_training_shards(args.data_dir)),
        backend.world_size,
        backend.rank,
        args.seed,
    )

    backend.seed(args.seed)  # the same initial weights on every rank
    model = build_model(args.model_config).to(device=backend.device, dtype=backend.default_dtype())
    model.train()
    optimizer = build_optimizer(args.optimizer, model, args.lr, args.weight_decay)
    learner = Learner(model, optimizer, new_scheduler(optimizer, args))

    state = TrainingState()
    saved: dict[str, Any] | None = None
    ckpt_dir = checkpoints.checkpoint_dir(args.output_dir)
    if writes:
        folder, present = outputs_of_an_earlier_run(args, layout)
        archive = move_aside(folder, present)
        if archive is not None:
            log.warning(
                "%s held the outputs of an earlier run; this run moved them to %s",
                folder,
                archive,
            )
    if args.resume and extraction:
        log.info("graph extraction: %s ignored (no state is real here)", "--resume")
    elif args.resume:
        if layout is not None:
            if rank0:
                point = adopt_resume_point(layout, ckpt_dir)
                if point is not None:
                    log.info(
                        "resume point: step %d of attempt %d (%s)",
                        point.checkpoint.step,
                        point.attempt,
                        point.checkpoint.path,
                    )
            backend.barrier("checkpoint-adopt")
        found = load_newest_checkpoint(args, backend)
        if found is None:
            where = ckpt_dir if layout is None else f"the attempts before {layout.attempt}"
            log.info("--resume: no checkpoint in %s yet, starting from step 0", where)
        else:
            ckpt, saved = found
            check_resumable(args, ckpt.path, saved, backend)
            state = restore(saved, learner, args)
            log.info("resuming from step %d (%s)", state.step, ckpt.path)

    lengths = data_stream.ShardLengths(expect)
    start = data_stream.position_after(plan, lengths, args.batch_size, state.micro_batches_consumed)
    if saved is not None and rank0:
        verify_position(saved, plan, start, args)
    last = final_step(args, state.step)
    if state.step >= last:
        log.info("already at step %d of %d: nothing to do", state.step, args.max_steps)
        return state.step

    with ExitStack() as stack:
        stream = stack.enter_context(
            data_stream.RankDataStream(plan, args.batch_size, expect, start)
        )
        sink: metrics.MetricsSink = (
            metrics.Rank0Sink(args.output_dir, restart_step=state.step)
            if writes
            else metrics.SilentSink()
        )
        stack.callback(sink.close)
        if writes:
            removed = checkpoints.remove_stale_temporaries(ckpt_dir)
            if removed:
                log.info("removed %d partial checkpoint file(s) of a killed writer", len(removed))
            sink.note(f"arguments: {args.as_record()}; start step {state.step}")
        if not extraction:
            try:
                profiler.start_profiling()
            except profiler.ProfilerConfigError as exc:
                raise RunError(f"{exc}; fix the TRAINIUM_PROFILE* variables") from exc
            stack.callback(stop_profiler)
            if writes and state.step > 0:
                # Resumed from the checkpoint of this step: a restart now loses what follows it.
                # Only the rank that writes checkpoints says so (the operator takes the lowest).
                profiler.checkpoint_saved(state.step)

        trainer = Trainer(args, backend, learner, stream=stream, sink=sink)
        log.info(
            "training steps %d..%d of %d, global batch %d sequences",
            state.step + 1,
            last,
            args.max_steps,
            trainer.global_batch,
        )
        saved_step = state.step
        for step in range(state.step + 1, last + 1):
            profiler.step(step)
            with profiler.annotate(ANNOTATE_STEP):
                trainer.run_step(step)
            state.step = step
            state.micro_batches_consumed += args.grad_accum_usteps
            if extraction and rank0:
                print(f"graph extraction: step {step} traced", flush=True)
            if writes and (step % args.checkpoint_every_steps == 0 or step == last):
                write_checkpoint(args, backend, learner, state, plan=plan, position=stream.position)
                saved_step = step
                profiler.checkpoint_saved(step)  # status.goodput: a restart loses what follows
        log.info(
            "finished at step %d (last checkpoint: step %d)",
            state.step,
            saved_step if writes else 0,
        )
    return state.step


def write_checkpoint(
    args: TrainingArguments,
    backend: devices.Backend,
    learner: Learner,
    state: TrainingState,
    *,
    plan: data_stream.ShardPlan,
    position: data_stream.DataPosition,
) -> Path:
    started = time.monotonic()
    payload = checkpoint_payload(args, learner, state, plan=plan, position=position)
    directory = checkpoints.checkpoint_dir(args.output_dir)
    path = backend.save_checkpoint(payload, directory, state.step)
    pruned = checkpoints.prune(directory, args.num_ckpts_to_keep)
    log.info(
        "checkpoint %s written in %.2fs%s",
        path,
        time.monotonic() - started,
        f", removed {len(pruned)} older" if pruned else "",
    )
    return path


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_arguments(argv)
    configure_logging(int(os.environ.get("RANK", "0") or 0))
    try:
        run(args, os.environ)
    except (RunError, shards.ShardFormatError, checkpoints.CheckpointError) as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Rank 0's training metrics: a stdout line, a JSON-lines file and TensorBoard events per step.

`<output_dir>/metrics.jsonl` holds one object per logged step (see `StepMetrics`). On resume
the records after the checkpoint's step are dropped (the steps are about to be redone), and
the TensorBoard writer purges the same steps, so both read as one continuous run.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final, Protocol

METRICS_FILE: Final = "metrics.jsonl"
TENSORBOARD_SUBDIR: Final = "tensorboard"


@dataclass(frozen=True)
class StepMetrics:
    step: int
    loss: float
    learning_rate: float
    grad_norm: float
    step_time_s: float
    sequences_per_s: float
    global_batch: int
    world_size: int
    epoch: int
    shard_round: int
    shard_batch: int
    wall_time: float

    def line(self) -> str:
        return (
            f"step {self.step} loss {self.loss:.4f} lr {self.learning_rate:.3e} "
            f"grad_norm {self.grad_norm:.3f} step_time {self.step_time_s:.3f}s "
            f"throughput {self.sequences_per_s:.1f} seq/s"
        )

    def as_json(self) -> str:
        # NaN/inf are not JSON; write null so every line parses.
        record: dict[str, Any] = {
            k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in asdict(self).items()
        }
        return json.dumps(record, sort_keys=True)


class MetricsSink(Protocol):
    def record(self, metrics: StepMetrics) -> None: ...

    def note(self, text: str) -> None: ...

    def close(self) -> None: ...


class SilentSink:
    """Ranks other than 0, and graph extraction (values are not real): write nothing."""

    def record(self, metrics: StepMetrics) -> None:
        return None

    def note(self, text: str) -> None:
        return None

    def close(self) -> None:
        return None


def drop_records_after(path: Path, step: int) -> int:
    """Rewrite the metrics file without records past `step`; returns how many were dropped."""
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record_step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue  # a line torn by a kill mid-write
        if record_step <= step:
            kept.append(line)
        else:
            dropped += 1
    temporary = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    temporary.write_text("".join(f"{line}\n" for line in kept))
    os.replace(temporary, path)
    return dropped


class Rank0Sink:
    """stdout + metrics.jsonl + TensorBoard under `output_dir`."""

    def __init__(self, output_dir: Path, restart_step: int) -> None:
        """`restart_step`: the step this run continues from (0 for a fresh run)."""
        from torch.utils.tensorboard import SummaryWriter

        output_dir.mkdir(parents=True, exist_ok=True)
        self.path = output_dir / METRICS_FILE
        drop_records_after(self.path, restart_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._tensorboard = SummaryWriter(
            log_dir=str(output_dir / TENSORBOARD_SUBDIR), purge_step=restart_step + 1
        )

    def record(self, metrics: StepMetrics) -> None:
        print(metrics.line(), flush=True)
        self._file.write(metrics.as_json() + "\n")
        self._file.flush()
        writer = self._tensorboard
        step = metrics.step
        writer.add_scalar("train/loss", metrics.loss, step, walltime=metrics.wall_time)
        writer.add_scalar("train/learning_rate", metrics.learning_rate, step)
        writer.add_scalar("train/grad_norm", metrics.grad_norm, step)
        writer.add_scalar("perf/step_time_s", metrics.step_time_s, step)
        writer.add_scalar("perf/sequences_per_s", metrics.sequences_per_s, step)

    def note(self, text: str) -> None:
        self._tensorboard.add_text("run", text)

    def close(self) -> None:
        self._file.close()
        self._tensorboard.close()


class Throughput:
    """Step time between consecutive step ends, measured where the values become known."""

    def __init__(self) -> None:
        self._last = time.monotonic()

    def lap(self) -> float:
        now = time.monotonic()
        elapsed, self._last = now - self._last, now
        return elapsed

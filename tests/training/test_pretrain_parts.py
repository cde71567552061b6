"""Pure parts of pretrain.py and its metrics file handling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainium_training import metrics
from trainium_training.arguments import parse_arguments
from trainium_training.pretrain import (
    PREVIOUS_RUNS_SUBDIR,
    earlier_outputs,
    final_step,
    move_aside,
    resolve_precision,
    step_seed,
)

pytestmark = pytest.mark.training


def test_a_fresh_run_moves_an_earlier_runs_outputs_aside_without_deleting(tmp_path: Path) -> None:
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "ckpt_500.pt").write_bytes(b"old")
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "unrelated.txt").write_text("kept in place")

    archive = move_aside(tmp_path, earlier_outputs(tmp_path), now=0.0)

    assert archive == tmp_path / PREVIOUS_RUNS_SUBDIR / "19700101T000000Z"
    assert (archive / "checkpoints" / "ckpt_500.pt").read_bytes() == b"old"
    assert (archive / "metrics.jsonl").exists()
    assert not (tmp_path / "checkpoints").exists()
    assert (tmp_path / "unrelated.txt").exists()
    (tmp_path / "metrics.jsonl").write_text("")
    again = move_aside(tmp_path, earlier_outputs(tmp_path), now=0.0)
    assert again == archive.with_name("19700101T000000Z-1")


def test_an_empty_output_dir_needs_no_archive(tmp_path: Path) -> None:
    assert move_aside(tmp_path / "new", earlier_outputs(tmp_path / "new")) is None


def test_steps_this_run_bounds_a_run_from_where_it_starts() -> None:
    args = parse_arguments(["--data_dir", "d", "--max_steps", "100", "--steps_this_run", "10"], {})
    assert final_step(args, start_step=0) == 10
    assert final_step(args, start_step=95) == 100
    unbounded = parse_arguments(["--data_dir", "d", "--max_steps", "100"], {})
    assert final_step(unbounded, start_step=40) == 100


def test_auto_precision_is_bf16_on_xla_and_fp32_on_cpu() -> None:
    assert resolve_precision("auto", "xla") == "bf16"
    assert resolve_precision("auto", "cpu") == "fp32"
    assert resolve_precision("bf16", "cpu") == "bf16"


def test_step_seeds_are_stable_and_differ_per_rank_and_step() -> None:
    seeds = {step_seed(12349, rank, step) for rank in range(4) for step in range(1, 50)}
    assert len(seeds) == 4 * 49
    assert step_seed(1, 2, 3) == step_seed(1, 2, 3)


def test_resuming_drops_metrics_of_steps_that_will_be_redone(tmp_path: Path) -> None:
    path = tmp_path / metrics.METRICS_FILE
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in range(1, 8)]
    path.write_text("\n".join(lines) + '\n{"step": 8, "lo')  # torn by a kill mid-write
    assert metrics.drop_records_after(path, 4) == 3
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3, 4]


def test_a_metrics_record_is_one_json_line_with_non_finite_values_as_null() -> None:
    record = metrics.StepMetrics(
        step=3,
        loss=float("nan"),
        learning_rate=1e-4,
        grad_norm=float("inf"),
        step_time_s=0.5,
        sequences_per_s=64.0,
        global_batch=32,
        world_size=2,
        epoch=0,
        shard_round=1,
        shard_batch=4,
        wall_time=1.0,
    )
    parsed = json.loads(record.as_json())
    assert parsed["loss"] is None
    assert parsed["grad_norm"] is None
    assert parsed["sequences_per_s"] == 64.0
    assert "throughput 64.0 seq/s" in record.line()

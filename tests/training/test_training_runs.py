"""Real training runs: torchrun, two CPU ranks over gloo, a tiny BERT on generated shards."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from training.training_helpers import PRETRAIN, RUN_TIMEOUT_S, child_env, run, torchrun_argv
from trainium_operator.contract.training_flags import (
    DATA_DIR_FLAG,
    OUTPUT_DIR_FLAG,
    RESUME_FLAG,
    STEPS_THIS_RUN_FLAG,
)
from trainium_operator.profiler.events import EventKind
from trainium_operator.profiler.format import iter_events
from trainium_training import checkpoints
from trainium_training.make_shards import ShardSpec, generate_arrays, make_shards, write_shard
from trainium_training.pretrain import (
    ANNOTATE_BACKWARD,
    ANNOTATE_DATA,
    ANNOTATE_FORWARD,
    ANNOTATE_OPTIMIZER,
    ANNOTATE_STEP,
)

pytestmark = [pytest.mark.training, pytest.mark.e2e]

TINY = ["--model_config", "tiny", "--batch_size", "4", "--warmup_steps", "0"]


@pytest.fixture(scope="module")
def distinct_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four shards of 40 distinct samples: 10 batches of 4 each, two rounds per rank."""
    folder = tmp_path_factory.mktemp("distinct")
    make_shards(
        folder,
        ShardSpec(num_shards=4, samples_per_shard=40, seq_len=32, max_pred=5, vocab_size=1024),
    )
    return folder


@pytest.fixture(scope="module")
def repeated_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every batch holds the same four samples: a model that learns must drive the loss down."""
    folder = tmp_path_factory.mktemp("repeated")
    spec = ShardSpec(
        num_shards=2,
        samples_per_shard=16,
        seq_len=32,
        max_pred=5,
        vocab_size=1024,
        distinct_samples=4,
    )
    make_shards(folder, spec)
    return folder


def read_metrics(output_dir: Path) -> list[dict[str, Any]]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def final_checkpoint(output_dir: Path) -> dict[str, Any]:
    newest = checkpoints.newest_checkpoint(checkpoints.checkpoint_dir(output_dir))
    assert newest is not None, f"no checkpoint in {output_dir}"
    return checkpoints.load(newest.path)


def assert_succeeded(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, (
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-6000:]}"
    )


def test_two_ranks_drive_the_loss_down_and_report_metrics_tensorboard_and_profile(
    repeated_data: Path, tmp_path: Path
) -> None:
    output, profile = tmp_path / "out", tmp_path / "profile"
    env = child_env(
        TRAINIUM_PROFILE="1",
        TRAINIUM_PROFILE_DIR=str(profile),
        TRAINIUM_PROFILE_STEPS="2:4",
        TRAINIUM_PROFILE_SOURCES="none",
        TRAINIUM_NODE_NAME="node-a",
    )
    args = [*TINY, "--grad_accum_usteps", "1", "--max_steps", "16", "--lr", "1e-2"]
    result = run(
        torchrun_argv(2, [*args, DATA_DIR_FLAG, str(repeated_data), OUTPUT_DIR_FLAG, str(output)]),
        env,
    )
    assert_succeeded(result)

    records = read_metrics(output)
    assert [r["step"] for r in records] == list(range(1, 17))
    first, last = records[0]["loss"], sum(r["loss"] for r in records[-3:]) / 3
    assert last < 0.5 * first, f"loss {first:.3f} -> {last:.3f} did not fall on a repeated batch"
    assert all(r["sequences_per_s"] > 0 and r["step_time_s"] > 0 for r in records)
    assert {r["global_batch"] for r in records} == {8}, "4 sequences x 1 micro-batch x 2 ranks"
    assert result.stdout.count("step 1 loss") == 1, "only rank 0 prints metrics"
    assert "seq/s" in result.stdout

    from tensorboard.backend.event_processing.event_accumulator import (  # type: ignore[import-untyped]
        EventAccumulator,
    )

    events = EventAccumulator(str(output / "tensorboard"))
    events.Reload()
    assert [s.step for s in events.Scalars("train/loss")] == list(range(1, 17))
    assert "perf/sequences_per_s" in events.Tags()["scalars"]

    assert final_checkpoint(output)["step"] == 16

    rank_files = sorted((profile / "node-a").glob("rank-*.trnprof"))
    assert [p.name for p in rank_files] == ["rank-0.trnprof", "rank-1.trnprof"]
    for path in rank_files:
        recorded = list(iter_events(path))
        names = {e.name for e in recorded if e.kind is EventKind.ANNOTATION}
        assert {
            ANNOTATE_STEP,
            ANNOTATE_DATA,
            ANNOTATE_FORWARD,
            ANNOTATE_BACKWARD,
            ANNOTATE_OPTIMIZER,
        } <= names
        assert sorted(e.value for e in recorded if e.kind is EventKind.STEP) == list(range(1, 17))


def start_in_own_group(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as sink:
        return subprocess.Popen(
            argv, env=child_env(), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each rank in a session of its own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, frontier = [], [pid]
    while frontier:
        below = children.get(frontier.pop(), [])
        found += below
        frontier += below
    return found


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL torchrun and its ranks at once, as a node failure or pod deletion would."""
    os.kill(process.pid, signal.SIGSTOP)  # it can no longer react by signalling its ranks
    victims = [process.pid, *descendants(process.pid)]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{pid}").exists() and not _is_zombie(pid) for pid in victims):
        if time.monotonic() > deadline:
            pytest.fail(f"processes {victims} survived SIGKILL")
        time.sleep(0.05)


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def wait_for_first_checkpoint(process: subprocess.Popen[bytes], directory: Path, log: Path) -> int:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        newest = checkpoints.newest_checkpoint(directory)
        if newest is not None:
            return newest.step
        if process.poll() is not None:
            pytest.fail(
                f"run exited ({process.returncode}) before a checkpoint:\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.01)
    kill_tree(process)
    pytest.fail("no checkpoint within the timeout")


@pytest.fixture
def reaped() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            kill_tree(process)


def test_a_killed_run_resumed_with_resume_matches_an_uninterrupted_run(
    distinct_data: Path, tmp_path: Path, reaped: list[subprocess.Popen[bytes]]
) -> None:
    max_steps = 12
    args = [
        *TINY,
        "--grad_accum_usteps", "2",
        "--max_steps", str(max_steps),
        "--lr", "5e-3",
        "--checkpoint_every_steps", "3",
        "--num_ckpts_to_keep", "2",
        DATA_DIR_FLAG, str(distinct_data),
    ]  # fmt: skip
    reference_dir, interrupted_dir = tmp_path / "reference", tmp_path / "interrupted"

    # Uninterrupted, and with --resume from the start: no checkpoint yet means step 0.
    reference = run(torchrun_argv(2, [*args, OUTPUT_DIR_FLAG, str(reference_dir), RESUME_FLAG]))
    assert_succeeded(reference)
    assert "no checkpoint in" in reference.stderr

    # First attempt (the operator adds no --resume), killed with SIGKILL after its first checkpoint.
    log = tmp_path / "attempt0.log"
    attempt0 = start_in_own_group(
        torchrun_argv(2, [*args, OUTPUT_DIR_FLAG, str(interrupted_dir)]), log
    )
    reaped.append(attempt0)
    wait_for_first_checkpoint(attempt0, checkpoints.checkpoint_dir(interrupted_dir), log)
    kill_tree(attempt0)
    killed_at = checkpoints.newest_checkpoint(checkpoints.checkpoint_dir(interrupted_dir))
    assert killed_at is not None
    assert killed_at.step < max_steps, "the kill must land mid-run"
    time.sleep(1.0)
    assert (
        checkpoints.newest_checkpoint(checkpoints.checkpoint_dir(interrupted_dir)) == killed_at
    ), "nothing wrote after the kill"
    assert "finished at step" not in log.read_text()

    # Second attempt, as after a gang restart.
    resumed = run(torchrun_argv(2, [*args, OUTPUT_DIR_FLAG, str(interrupted_dir), RESUME_FLAG]))
    assert_succeeded(resumed)
    assert f"resuming from step {killed_at.step} " in resumed.stderr
    assert f"training steps {killed_at.step + 1}..{max_steps}" in resumed.stderr

    expected, actual = final_checkpoint(reference_dir), final_checkpoint(interrupted_dir)
    assert actual["step"] == expected["step"] == max_steps
    assert actual["data"] == expected["data"], "same micro-batch count and data position"
    assert actual["scheduler"]["last_epoch"] == expected["scheduler"]["last_epoch"]
    for name, tensor in expected["model"].items():
        torch.testing.assert_close(actual["model"][name], tensor, rtol=0, atol=1e-6, msg=name)
    for index, state in expected["optimizer"]["state"].items():
        for key, tensor in state.items():
            torch.testing.assert_close(
                actual["optimizer"]["state"][index][key], tensor, rtol=0, atol=1e-6
            )

    # The metrics read as one run, and every step saw the same data with the same loss.
    reference_records, resumed_records = read_metrics(reference_dir), read_metrics(interrupted_dir)
    assert [r["step"] for r in resumed_records] == list(range(1, max_steps + 1))
    for want, got in zip(reference_records, resumed_records, strict=True):
        assert (got["epoch"], got["shard_round"], got["shard_batch"]) == (
            want["epoch"], want["shard_round"], want["shard_batch"],
        )  # fmt: skip
        assert got["loss"] == pytest.approx(want["loss"], abs=1e-5), f"step {want['step']}"
    assert reference_records[-1]["epoch"] == 1, "the run crosses an epoch boundary"


def test_graph_extraction_runs_the_steps_and_writes_nothing(
    distinct_data: Path, tmp_path: Path
) -> None:
    output = tmp_path / "compile-out"
    args = [
        *TINY,
        "--grad_accum_usteps",
        "2",
        "--max_steps",
        "100",
        "--checkpoint_every_steps",
        "1",
    ]
    argv = torchrun_argv(
        2,
        [
            *args,
            DATA_DIR_FLAG,
            str(distinct_data),
            OUTPUT_DIR_FLAG,
            str(output),
            STEPS_THIS_RUN_FLAG,
            "3",
            RESUME_FLAG,
        ],
    )
    result = run(
        argv,
        child_env(
            NEURON_EXTRACT_GRAPHS_ONLY="1",
            TRAINIUM_PROFILE="1",
            TRAINIUM_PROFILE_DIR=str(tmp_path / "profile"),
        ),
    )
    assert_succeeded(result)
    assert "graph extraction: step 3 traced" in result.stdout
    assert "graph extraction: step 4" not in result.stdout, "--steps_this_run bounds the run"
    assert not output.exists(), "no checkpoint, metrics or TensorBoard file"
    assert not (tmp_path / "profile").exists(), "no profile either"


def test_a_malformed_shard_fails_the_run_naming_the_file_and_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    arrays = generate_arrays(
        ShardSpec(samples_per_shard=8, seq_len=16, max_pred=3, vocab_size=1024), 0
    )
    arrays["segment_ids"] = arrays["segment_ids"][:, :8]
    write_shard(data / "broken_training_0.hdf5", arrays)
    result = run(
        [sys.executable, str(PRETRAIN), *TINY, "--max_steps", "1", "--grad_accum_usteps", "1",
         DATA_DIR_FLAG, str(data), OUTPUT_DIR_FLAG, str(tmp_path / "out")],
    )  # fmt: skip
    assert result.returncode == 1
    assert (
        f"{data / 'broken_training_0.hdf5'}: key 'segment_ids': has shape (8, 8), expected (8, 16)"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
    assert not checkpoints.list_checkpoints(checkpoints.checkpoint_dir(tmp_path / "out"))


def test_the_xla_backend_trains_and_resumes_on_torch_xlas_cpu_device(
    distinct_data: Path, tmp_path: Path
) -> None:
    """The Neuron code path (torch-xla graphs, mark_step, step closures, bf16), minus Neuron.

    torch-xla's CPU PJRT device is single-process, so this runs one rank without torchrun.
    """
    pytest.importorskip("torch_xla", reason="torch-xla is not installed")
    output = tmp_path / "xla-out"
    args = [
        sys.executable, str(PRETRAIN), *TINY, "--device", "xla", "--optimizer", "lamb",
        "--grad_accum_usteps", "1", "--max_steps", "3", "--checkpoint_every_steps", "2",
        DATA_DIR_FLAG, str(distinct_data), OUTPUT_DIR_FLAG, str(output),
    ]  # fmt: skip
    # Cheap CPU code generation: the graphs compile in seconds instead of half a minute.
    env = child_env(
        PJRT_DEVICE="CPU",
        XLA_FLAGS="--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true",
    )
    first = run([*args, STEPS_THIS_RUN_FLAG, "2"], env)
    assert_succeeded(first)
    assert "device xla, world size 1, dtype torch.bfloat16" in first.stderr
    assert [r["step"] for r in read_metrics(output)] == [1, 2]

    resumed = run([*args, RESUME_FLAG], env)
    assert_succeeded(resumed)
    assert "resuming from step 2 " in resumed.stderr
    records = read_metrics(output)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["loss"] > 0 for r in records)
    saved = final_checkpoint(output)
    assert saved["step"] == 3
    weights = saved["model"]["bert.embeddings.word_embeddings.weight"]
    assert weights.dtype == torch.bfloat16
    assert weights.device.type == "cpu"
    moments = next(iter(saved["optimizer"]["state"].values()))
    assert moments["exp_avg"].dtype == torch.float32


def test_the_xla_backend_refuses_ranks_it_cannot_connect(
    distinct_data: Path, tmp_path: Path
) -> None:
    pytest.importorskip("torch_xla", reason="torch-xla is not installed")
    result = run(
        torchrun_argv(
            2,
            [
                *TINY,
                "--device",
                "xla",
                "--max_steps",
                "1",
                DATA_DIR_FLAG,
                str(distinct_data),
                OUTPUT_DIR_FLAG,
                str(tmp_path / "out"),
            ],
        ),
        child_env(PJRT_DEVICE="CPU"),
    )
    assert result.returncode != 0
    assert "torchrun started WORLD_SIZE=2 ranks but the XLA process group holds 1" in result.stderr
    assert not (tmp_path / "out").exists()


NATIVE_STACK_LOG = "Neuron stack native: torch device cpu, process group gloo, torch.compile off"


def test_the_native_stack_on_two_cpu_ranks_trains_and_resumes_as_the_xla_stacks_cpu_path(
    distinct_data: Path, tmp_path: Path
) -> None:
    """The native code path (DDP over gloo, no_sync across micro-batches, eager) gives the
    losses and gradient norms the XLA stack's CPU path (hand-written all-reduce) gives, and
    its checkpoints hold the plain model (no DDP prefix), so either stack resumes them."""
    args = [
        *TINY,
        "--grad_accum_usteps",
        "2",
        "--max_steps",
        "3",
        DATA_DIR_FLAG,
        str(distinct_data),
    ]
    native_env = child_env(TRAINIUM_NEURON_STACK="native")
    native, xla = tmp_path / "native", tmp_path / "xla"

    first = run(
        torchrun_argv(2, [*args, OUTPUT_DIR_FLAG, str(native), STEPS_THIS_RUN_FLAG, "2"]),
        native_env,
    )
    assert_succeeded(first)
    assert NATIVE_STACK_LOG in first.stderr
    assert "device native, world size 2, dtype torch.float32" in first.stderr
    resumed = run(torchrun_argv(2, [*args, OUTPUT_DIR_FLAG, str(native), RESUME_FLAG]), native_env)
    assert_succeeded(resumed)
    assert "resuming from step 2 " in resumed.stderr
    reference = run(torchrun_argv(2, [*args, OUTPUT_DIR_FLAG, str(xla)]), child_env())
    assert_succeeded(reference)
    assert "Neuron stack xla: torch device cpu, process group gloo" in reference.stderr

    by_native, by_xla = read_metrics(native), read_metrics(xla)
    assert [r["step"] for r in by_native] == [r["step"] for r in by_xla] == [1, 2, 3]
    for ours, theirs in zip(by_native, by_xla, strict=True):
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-5)
        assert ours["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
        assert ours["global_batch"] == theirs["global_batch"] == 16
    saved, expected = final_checkpoint(native), final_checkpoint(xla)
    assert saved["step"] == 3
    assert set(saved["model"]) == set(expected["model"])
    name = "bert.embeddings.word_embeddings.weight"
    assert torch.allclose(saved["model"][name], expected["model"][name], atol=1e-5)

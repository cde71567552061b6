"""Attempts never share a write path: a resumed gang starts from the newest complete checkpoint
of the earlier attempts and writes only under its own attempt's directory, whatever a
partitioned earlier gang still writes. Real training in-process (tiny BERT, one CPU rank), with
the environment and arguments the operator's own builder gives a training pod."""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trainium_operator.builders import pods
from trainium_operator.builders.job import Stage
from trainium_training import checkpoints, pretrain
from trainium_training.arguments import TrainingArguments, parse_arguments
from trainium_training.make_shards import ShardSpec, make_shards
from unit.jobs import job_ref

pytestmark = pytest.mark.training

SCRIPT = "/opt/trainium/trainium_training/pretrain.py"
TINY = [
    *["--model_config", "tiny", "--batch_size", "4", "--warmup_steps", "0", "--device", "cpu"],
    *["--grad_accum_usteps", "1", "--max_steps", "20", "--checkpoint_every_steps", "2"],
    *["--num_ckpts_to_keep", "2", "--lr", "5e-3"],
]


@pytest.fixture(autouse=True)
def logging_restored() -> Iterator[None]:
    """pretrain.run configures the root logger for its process; give the test runner's back."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:], root.level = handlers, level


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("shards")
    make_shards(
        folder,
        ShardSpec(num_shards=2, samples_per_shard=40, seq_len=32, max_pred=5, vocab_size=1024),
    )
    return folder


def training_pod(
    data: Path, root: Path, attempt: int, steps: int, *, resume: bool
) -> tuple[TrainingArguments, dict[str, str]]:
    """The arguments and environment of gang `attempt` of a job whose outputDir is `root`, as
    the operator builds its pod."""
    job = job_ref(
        command={
            "script": SCRIPT,
            "args": TINY,
            "dataDirArg": "--data_dir",
            "outputDirArg": "--output_dir",
            "resumeArgs": ["--resume"],
        },
        dataDir=str(data),
        outputDir=str(root),
    )
    container = pods.pod(job, Stage.TRAIN, attempt, 0, resume=resume)["spec"]["containers"][0]
    environ = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    argv = container["command"]
    args = parse_arguments([*argv[argv.index(SCRIPT) + 1 :], "--steps_this_run", str(steps)], {})
    return args, environ


def run_attempt(data: Path, root: Path, attempt: int, steps: int, *, resume: bool) -> int:
    return pretrain.run(*training_pod(data, root, attempt, steps, resume=resume))


def test_the_attempt_layout_applies_to_the_attempts_own_directory_only(tmp_path: Path) -> None:
    args, environ = training_pod(tmp_path, tmp_path / "out", 2, 1, resume=True)
    layout = pretrain.attempt_layout(args, environ)
    assert layout is not None
    assert (layout.attempt, Path(layout.output_dir)) == (2, tmp_path / "out" / "attempt-2")
    elsewhere = replace(args, output_dir=tmp_path / "mine")
    assert pretrain.attempt_layout(elsewhere, environ) is None, "the user's own dir, as asked"
    assert pretrain.attempt_layout(args, {}) is None, "run by hand"
    for other in ("attempt-0", "attempt-1"):
        earlier = replace(args, output_dir=tmp_path / "out" / other)
        with pytest.raises(pretrain.RunError, match="another attempt's directory"):
            pretrain.attempt_layout(earlier, environ)


def files_under(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


@pytest.fixture(scope="module")
def two_attempts(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Attempt 0 trained to step 4; attempt 1 resumed from it and trained to step 6."""
    root = tmp_path_factory.mktemp("two-attempts") / "output"
    assert run_attempt(data, root, 0, 4, resume=False) == 4
    assert run_attempt(data, root, 1, 2, resume=True) == 6
    return root


@pytest.fixture
def root(two_attempts: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "output"
    shutil.copytree(two_attempts, copy)
    return copy


def steps_in(root: Path, attempt: int) -> list[int]:
    directory = checkpoints.checkpoint_dir(root / f"attempt-{attempt}")
    return [c.step for c in checkpoints.list_checkpoints(directory)]


def test_a_resume_at_attempt_2_starts_from_the_newest_earlier_checkpoint_and_writes_only_its_own(
    data: Path, root: Path
) -> None:
    assert (steps_in(root, 0), steps_in(root, 1)) == ([2, 4], [4, 6])
    earlier = checkpoints.checkpoint_dir(root / "attempt-1")
    (earlier / ".ckpt_12.pt.tmp-4242").write_bytes(b"half of a checkpoint")
    later = checkpoints.checkpoint_dir(root / "attempt-3")
    later.mkdir(parents=True)
    (later / "ckpt_18.pt").write_bytes(b"not readable: a resume must not even open it")
    own = checkpoints.checkpoint_dir(root / "attempt-2")
    own.mkdir(parents=True)
    (own / "ckpt_16.pt").write_bytes(b"an earlier run's, left in attempt 2's directory")
    outside_before = {k: v for k, v in files_under(root).items() if not k.startswith("attempt-2/")}

    assert run_attempt(data, root, 2, 2, resume=True) == 8

    assert steps_in(root, 2) == [6, 8], "resumed at step 6 (attempt 1), then saved step 8"
    adopted = checkpoints.load(own / "ckpt_6.pt")
    resumed_from = checkpoints.load(earlier / "ckpt_6.pt")
    for name, tensor in resumed_from["model"].items():
        torch.testing.assert_close(adopted["model"][name], tensor, rtol=0, atol=0, msg=name)
    outside_after = {k: v for k, v in files_under(root).items() if not k.startswith("attempt-2/")}
    assert outside_after == outside_before, "nothing outside attempt 2's directory changed"
    moved = list((root / "attempt-2" / pretrain.PREVIOUS_RUNS_SUBDIR).rglob("ckpt_16.pt"))
    assert len(moved) == 1, "the earlier run's file in attempt 2's directory was moved aside"


def test_a_partitioned_earlier_gang_writing_on_never_changes_the_resumed_gangs_files(
    data: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    earlier = checkpoints.checkpoint_dir(root / "attempt-1")
    template = checkpoints.load(earlier / "ckpt_6.pt")

    def old_gang_saves(step: int) -> None:
        checkpoints.save_atomic({**template, "step": step}, earlier, step)
        checkpoints.prune(earlier, keep=1)

    adopt = checkpoints.adopt

    def adopt_then_the_old_gang_writes(source: checkpoints.CheckpointFile, directory: Path) -> Path:
        adopted = adopt(source, directory)
        old_gang_saves(7)  # between attempt 2 choosing step 6 and its ranks loading it
        return adopted

    monkeypatch.setattr(checkpoints, "adopt", adopt_then_the_old_gang_writes)

    assert run_attempt(data, root, 2, 2, resume=True) == 8

    assert steps_in(root, 1) == [7], "the old gang pruned the file attempt 2 resumed from"
    assert steps_in(root, 2) == [6, 8]
    own_files = files_under(root / "attempt-2")
    old_gang_saves(9)
    old_gang_saves(10)
    assert files_under(root / "attempt-2") == own_files

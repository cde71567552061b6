"""Checkpoint files: atomic write, newest lookup, pruning, refusing what is not ours."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainium_training import checkpoints

pytestmark = pytest.mark.training


def payload(step: int) -> dict[str, object]:
    return {
        "format": checkpoints.FORMAT_NAME,
        "format_version": checkpoints.FORMAT_VERSION,
        "step": step,
        "model": {"w": torch.full((2,), float(step))},
    }


def test_saved_checkpoints_are_found_newest_last_and_load_back(tmp_path: Path) -> None:
    for step in (10, 2, 30):
        checkpoints.save_atomic(payload(step), tmp_path, step)
    assert [c.step for c in checkpoints.list_checkpoints(tmp_path)] == [2, 10, 30]
    newest = checkpoints.newest_checkpoint(tmp_path)
    assert newest is not None
    assert newest.path.name == "ckpt_30.pt"
    loaded = checkpoints.load(newest.path)
    assert torch.equal(loaded["model"]["w"], torch.full((2,), 30.0))


def test_an_interrupted_write_leaves_no_checkpoint_and_its_leftover_is_cleaned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoints.save_atomic(payload(1), tmp_path, 1)

    def die_mid_write(obj: object, handle: object) -> None:
        handle.write(b"half a checkpoint")  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", die_mid_write)
    with pytest.raises(KeyboardInterrupt):
        checkpoints.save_atomic(payload(2), tmp_path, 2)
    newest = checkpoints.newest_checkpoint(tmp_path)
    assert newest is not None
    assert newest.step == 1
    assert not list(tmp_path.glob(".ckpt_*")), "the writer removes its own temporary file"


def test_temporaries_of_a_killed_writer_are_ignored_then_removed(tmp_path: Path) -> None:
    checkpoints.save_atomic(payload(4), tmp_path, 4)
    leftover = tmp_path / ".ckpt_8.pt.tmp-12345"
    leftover.write_bytes(b"partial")
    newest = checkpoints.newest_checkpoint(tmp_path)
    assert newest is not None
    assert newest.step == 4
    assert checkpoints.remove_stale_temporaries(tmp_path) == [leftover]
    assert not leftover.exists()


def test_pruning_keeps_the_newest_k(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        checkpoints.save_atomic(payload(step), tmp_path, step)
    removed = checkpoints.prune(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["ckpt_1.pt", "ckpt_2.pt"]
    assert [c.step for c in checkpoints.list_checkpoints(tmp_path)] == [3, 4]


def test_a_missing_directory_has_no_checkpoints(tmp_path: Path) -> None:
    assert checkpoints.newest_checkpoint(tmp_path / "nothing") is None


def test_loading_a_corrupt_or_foreign_file_names_it(tmp_path: Path) -> None:
    corrupt = tmp_path / "ckpt_5.pt"
    corrupt.write_bytes(b"\x00garbage")
    with pytest.raises(checkpoints.CheckpointError, match="unreadable checkpoint") as caught:
        checkpoints.load(corrupt)
    assert str(corrupt) in str(caught.value)

    foreign = tmp_path / "ckpt_6.pt"
    torch.save({"state_dict": {}}, foreign)
    with pytest.raises(checkpoints.CheckpointError, match="not a trainium-training-checkpoint"):
        checkpoints.load(foreign)

    future = tmp_path / "ckpt_7.pt"
    torch.save({**payload(7), "format_version": 99}, future)
    with pytest.raises(checkpoints.CheckpointError, match="format version 99"):
        checkpoints.load(future)


def test_nested_state_moves_to_the_host_with_containers_kept() -> None:
    state = {"a": [torch.ones(1), (torch.zeros(1), 3)], "b": "x"}
    moved = checkpoints.to_cpu(state)
    assert isinstance(moved["a"], list)
    assert isinstance(moved["a"][1], tuple)
    assert moved["a"][1][1] == 3
    assert moved["b"] == "x"
    assert moved["a"][0].device.type == "cpu"


def attempt_checkpoints(root: Path, attempt: int, *steps: int) -> Path:
    directory = checkpoints.checkpoint_dir(root / f"attempt-{attempt}")
    for step in steps:
        checkpoints.save_atomic(payload(step), directory, step)
    return directory


def test_a_resume_takes_the_newest_complete_checkpoint_of_the_attempts_before_it(
    tmp_path: Path,
) -> None:
    attempt_checkpoints(tmp_path, 0, 3, 6)
    earlier = attempt_checkpoints(tmp_path, 1, 5)
    (earlier / ".ckpt_9.pt.tmp-4242").write_bytes(b"a partitioned gang is writing this")
    attempt_checkpoints(tmp_path, 2, 20)  # its own attempt: never a source
    attempt_checkpoints(tmp_path, 5, 30)  # a later attempt
    checkpoints.save_atomic(payload(40), checkpoints.checkpoint_dir(tmp_path / "compile-0"), 40)

    found = checkpoints.newest_of_earlier_attempts(tmp_path, attempt=2)

    assert found is not None
    assert (found.attempt, found.checkpoint.step) == (0, 6)
    assert found.checkpoint.path == tmp_path / "attempt-0" / "checkpoints" / "ckpt_6.pt"


def test_of_two_attempts_with_the_same_newest_step_the_later_one_wins(tmp_path: Path) -> None:
    attempt_checkpoints(tmp_path, 0, 6)
    attempt_checkpoints(tmp_path, 3, 6)
    found = checkpoints.newest_of_earlier_attempts(tmp_path, attempt=4)
    assert found is not None
    assert found.attempt == 3


def test_the_first_attempt_or_an_empty_root_has_nothing_to_resume_from(tmp_path: Path) -> None:
    attempt_checkpoints(tmp_path, 0, 6)
    assert checkpoints.newest_of_earlier_attempts(tmp_path, attempt=0) is None
    assert checkpoints.newest_of_earlier_attempts(tmp_path / "none", attempt=3) is None


@pytest.mark.parametrize("hard_links", [True, False])
def test_an_adopted_checkpoint_outlives_its_earlier_writer_pruning_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hard_links: bool
) -> None:
    if not hard_links:

        def no_links(source: object, target: object) -> None:
            raise PermissionError("this file system has no hard links")

        monkeypatch.setattr(checkpoints.os, "link", no_links)
    earlier = attempt_checkpoints(tmp_path, 1, 6)
    source = checkpoints.newest_checkpoint(earlier)
    assert source is not None
    own = checkpoints.checkpoint_dir(tmp_path / "attempt-2")

    adopted = checkpoints.adopt(source, own)
    # The earlier gang runs on: it writes a newer checkpoint and prunes the adopted one.
    checkpoints.save_atomic(payload(7), earlier, 7)
    checkpoints.prune(earlier, keep=1)

    assert adopted == own / "ckpt_6.pt"
    assert not source.path.exists()
    assert torch.equal(checkpoints.load(adopted)["model"]["w"], torch.full((2,), 6.0))
    assert not list(own.glob(".ckpt_*"))

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

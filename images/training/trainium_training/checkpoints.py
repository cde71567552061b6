"""Checkpoint files on the shared volume: atomic writes, newest lookup, keep-the-last-K.

Layout: `<output_dir>/checkpoints/ckpt_<step>.pt`, one file per saved step, written by rank 0.
A file is written under a hidden temporary name, fsynced, then renamed into place (rename is
atomic on POSIX file systems, FSx for Lustre included), so a reader (a restarted gang) sees a
complete checkpoint or none; a writer killed mid-way leaves only a temporary file, which the
next writer removes. Older checkpoints are pruned only after the new one is in place.

Under the operator each training attempt writes `<root>/attempt-<N>/checkpoints/` (the layout
is `trainium_operator.contract.workload_env`'s), and a resuming gang starts from the newest complete
checkpoint of the attempts before it (`newest_of_earlier_attempts`), which it first `adopt`s
into its own directory: an earlier gang that still runs (its node was only partitioned) may go
on writing and pruning there, but cannot change or remove what the new gang reads.

Files load with `torch.load(weights_only=True)`: a checkpoint holds tensors and plain Python
containers only, so loading one cannot run code.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final

import torch

from trainium_operator.contract import workload_env

log = logging.getLogger(__name__)

CHECKPOINT_SUBDIR: Final = "checkpoints"
FORMAT_NAME: Final = "trainium-training-checkpoint"
FORMAT_VERSION: Final = 1
_NAME = re.compile(r"^ckpt_(\d+)\.pt$")
_TEMP_PREFIX: Final = ".ckpt_"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class CheckpointFile:
    step: int
    path: Path


def checkpoint_dir(output_dir: Path) -> Path:
    return output_dir / CHECKPOINT_SUBDIR


def checkpoint_name(step: int) -> str:
    return f"ckpt_{step}.pt"


def list_checkpoints(directory: Path) -> list[CheckpointFile]:
    """Complete checkpoints in `directory`, oldest first (temporary files are not listed)."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match and entry.is_file():
            found.append(CheckpointFile(int(match.group(1)), entry))
    return sorted(found, key=lambda c: c.step)


def newest_checkpoint(directory: Path) -> CheckpointFile | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


@dataclass(frozen=True)
class AttemptCheckpoint:
    attempt: int
    checkpoint: CheckpointFile


def newest_of_earlier_attempts(root: Path, attempt: int) -> AttemptCheckpoint | None:
    """What a gang of `attempt` resumes from: the newest complete checkpoint by step (on a tie,
    the later attempt's) of the training attempts before it under the output root `root`.

    Never its own attempt's or a later one's. A gang of an earlier attempt may still be writing
    (its node was only partitioned): only files renamed into place count, never temporaries.
    """
    found = [
        AttemptCheckpoint(number, checkpoint)
        for number, directory in workload_env.training_attempt_dirs(root)
        if number < attempt
        for checkpoint in list_checkpoints(checkpoint_dir(directory))
    ]
    return max(found, key=lambda f: (f.checkpoint.step, f.attempt), default=None)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temporaries(directory: Path) -> list[Path]:
    """Delete temporary files left by a writer that died (call before this run writes)."""
    removed = []
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.name.startswith(_TEMP_PREFIX) and ".tmp-" in entry.name:
                entry.unlink(missing_ok=True)
                removed.append(entry)
    return removed


def _put_atomic(directory: Path, step: int, write: Callable[[Path], None]) -> Path:
    """Checkpoint `step` of `directory`, made by `write` under a temporary name, then renamed
    into place: it appears complete or not at all."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / checkpoint_name(step)
    temporary = directory / f"{_TEMP_PREFIX}{step}.pt.tmp-{os.getpid()}"
    try:
        write(temporary)
        os.replace(temporary, final)
        _fsync_dir(directory)
    finally:
        temporary.unlink(missing_ok=True)
    return final


def _fsynced(fill: Callable[[IO[bytes]], object]) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        with open(path, "wb") as handle:
            fill(handle)
            handle.flush()
            os.fsync(handle.fileno())

    return write


def save_atomic(state: Mapping[str, Any], directory: Path, step: int) -> Path:
    """Write `state` as checkpoint `step`; the file appears complete or not at all."""
    return _put_atomic(directory, step, _fsynced(lambda handle: torch.save(dict(state), handle)))


def adopt(source: CheckpointFile, directory: Path) -> Path:
    """Give `source` a name of its own in `directory` (this attempt's checkpoints).

    A hard link where the file system has them: no copy, and the two names share a file that
    never changes (writers only rename new files in and delete old names). Otherwise an atomic
    copy. FileNotFoundError: its writer pruned it meanwhile; look again.
    """

    def link_or_copy(temporary: Path) -> None:
        try:
            os.link(source.path, temporary)
        except FileNotFoundError:
            raise
        except OSError:
            with open(source.path, "rb") as original:
                _fsynced(lambda handle: shutil.copyfileobj(original, handle))(temporary)

    return _put_atomic(directory, source.step, link_or_copy)


def prune(directory: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` checkpoints; returns what was deleted."""
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")
    doomed = list_checkpoints(directory)[:-keep]
    for old in doomed:
        old.path.unlink(missing_ok=True)
    return [c.path for c in doomed]


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint onto the CPU and check that it is one of ours."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: checkpoint vanished while loading") from None
    except Exception as exc:
        raise CheckpointError(
            f"{path}: unreadable checkpoint ({type(exc).__name__}: {exc}); delete it to "
            "resume from the previous one"
        ) from exc
    if not isinstance(state, dict) or state.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path}: not a {FORMAT_NAME} file")
    version = state.get("format_version")
    if version != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: format version {version}, this script reads version {FORMAT_VERSION}"
        )
    return state


def to_cpu(value: Any) -> Any:
    """A copy of nested containers with every tensor moved to the host (XLA tensors too)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, Mapping):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(to_cpu(v) for v in value)
    return value

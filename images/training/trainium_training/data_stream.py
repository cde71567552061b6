"""Per-rank stream of micro-batches over the HDF5 shards, resumable from a micro-batch count.

Shard assignment follows the tutorial: every epoch all ranks shuffle the sorted shard list with
the same seed, and in round `r` of the epoch rank `k` reads shard `r * world_size + k`. An
epoch has `len(shards) // world_size` rounds, so no shard is read twice in an epoch (the
`len % world_size` left over differ from epoch to epoch). Inside a shard the samples are
shuffled per (seed, epoch, round, rank) and cut into full batches; the tail shorter than a
batch is dropped.

Because the whole order is a pure function of (seed, shard list, world size, batch size), a
rank's position after `n` micro-batches can be recomputed from the shards' lengths alone (their
HDF5 metadata), which is how a resumed run finds its place without per-rank state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from trainium_training import shards

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataPosition:
    """Where a rank's next micro-batch comes from: epoch, round in the epoch, batch in shard."""

    epoch: int = 0
    round: int = 0
    batch: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class ShardPlan:
    """Which shard a rank reads in each round of each epoch."""

    files: tuple[Path, ...]
    world_size: int
    rank: int
    seed: int

    def __post_init__(self) -> None:
        if len(self.files) < self.world_size:
            raise shards.ShardFormatError(
                f"--data_dir holds {len(self.files)} training shards but the job runs "
                f"{self.world_size} ranks; every rank needs its own shard, so provide at "
                f"least {self.world_size} shards"
            )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")

    @property
    def rounds_per_epoch(self) -> int:
        return len(self.files) // self.world_size

    def epoch_order(self, epoch: int) -> list[Path]:
        permutation = np.random.default_rng([self.seed, epoch]).permutation(len(self.files))
        return [self.files[int(i)] for i in permutation]

    def shard_for(self, epoch: int, round_: int) -> Path:
        return self.epoch_order(epoch)[round_ * self.world_size + self.rank]

    def next_round(self, epoch: int, round_: int) -> tuple[int, int]:
        if round_ + 1 < self.rounds_per_epoch:
            return epoch, round_ + 1
        return epoch + 1, 0


def sample_order(
    num_samples: int, seed: int, epoch: int, round_: int, rank: int
) -> npt.NDArray[np.int64]:
    """The order in which a rank visits a shard's samples."""
    rng = np.random.default_rng([seed, epoch, round_, rank, 0x5A])
    return rng.permutation(num_samples).astype(np.int64)


def position_after(
    plan: ShardPlan, shard_length: Callable[[Path], int], batch_size: int, micro_batches: int
) -> DataPosition:
    """The position of a rank that has consumed `micro_batches` batches since the start."""
    if micro_batches < 0:
        raise ValueError(f"micro_batches must be >= 0, got {micro_batches}")
    epoch, round_, remaining = 0, 0, micro_batches
    while True:
        batches = shard_length(plan.shard_for(epoch, round_)) // batch_size
        if batches < 1:
            raise shards.ShardFormatError(
                f"{plan.shard_for(epoch, round_)}: shorter than one batch of {batch_size}"
            )
        if remaining < batches:
            return DataPosition(epoch, round_, remaining)
        remaining -= batches
        epoch, round_ = plan.next_round(epoch, round_)


@dataclass(frozen=True)
class MicroBatch:
    """Model inputs for one micro-batch, as int64 host arrays, and where they came from."""

    input_ids: npt.NDArray[np.int64]
    attention_mask: npt.NDArray[np.int64]
    token_type_ids: npt.NDArray[np.int64]
    labels: npt.NDArray[np.int64]
    next_sentence_label: npt.NDArray[np.int64]
    position: DataPosition
    shard: Path

    def arrays(self) -> dict[str, npt.NDArray[np.int64]]:
        """Keyword arguments of BertForPreTraining.forward."""
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "token_type_ids": self.token_type_ids,
            "labels": self.labels,
            "next_sentence_label": self.next_sentence_label,
        }


def make_micro_batch(
    shard: shards.Shard, indices: npt.NDArray[np.int64], position: DataPosition
) -> MicroBatch:
    return MicroBatch(
        input_ids=shard.input_ids[indices],
        attention_mask=shard.input_mask[indices],
        token_type_ids=shard.segment_ids[indices],
        labels=shards.masked_lm_labels(
            shard.masked_lm_positions[indices], shard.masked_lm_ids[indices], shard.seq_len
        ),
        next_sentence_label=shard.next_sentence_labels[indices],
        position=position,
        shard=shard.path,
    )


class RankDataStream(Iterator[MicroBatch]):
    """Endless micro-batches for one rank, preloading the next shard on a worker thread."""

    def __init__(
        self,
        plan: ShardPlan,
        batch_size: int,
        expect: shards.ShardExpectations,
        start: DataPosition,
        *,
        prefetch: bool = True,
    ) -> None:
        self._plan = plan
        self._batch_size = batch_size
        self._expect = expect
        self._position = start
        self._pool = ThreadPoolExecutor(1, "shard-prefetch") if prefetch else None
        self._next: Future[shards.Shard] | None = None
        self._current: tuple[shards.Shard, npt.NDArray[np.int64]] | None = None
        self._current_key: tuple[int, int] | None = None

    @property
    def position(self) -> DataPosition:
        """Position of the next micro-batch."""
        return self._position

    def _read(self, path: Path) -> shards.Shard:
        return shards.read_shard(path, self._expect)

    def _load(self, epoch: int, round_: int) -> tuple[shards.Shard, npt.NDArray[np.int64]]:
        path = self._plan.shard_for(epoch, round_)
        shard = None
        if self._next is not None:
            pending, self._next = self._next, None
            shard = pending.result()  # re-raises a read error from the worker thread
            if shard.path != path:
                shard = None
        if shard is None:
            shard = self._read(path)
        if self._pool is not None:
            next_epoch, next_round = self._plan.next_round(epoch, round_)
            self._next = self._pool.submit(self._read, self._plan.shard_for(next_epoch, next_round))
        order = sample_order(shard.num_samples, self._plan.seed, epoch, round_, self._plan.rank)
        return shard, order

    def __next__(self) -> MicroBatch:
        pos = self._position
        key = (pos.epoch, pos.round)
        if self._current is None or self._current_key != key:
            self._current = self._load(*key)
            self._current_key = key
        shard, order = self._current
        batches = shard.num_samples // self._batch_size
        if pos.batch >= batches:
            # Only reachable when a resumed position points past a shard that has shrunk.
            raise shards.ShardFormatError(
                f"{shard.path}: data position {pos} is past the shard's {batches} batches; "
                "the shards changed since the checkpoint was written"
            )
        start = pos.batch * self._batch_size
        batch = make_micro_batch(shard, order[start : start + self._batch_size], pos)
        if pos.batch + 1 < batches:
            self._position = DataPosition(pos.epoch, pos.round, pos.batch + 1)
        else:
            epoch, round_ = self._plan.next_round(pos.epoch, pos.round)
            self._position = DataPosition(epoch, round_, 0)
        return batch

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def __enter__(self) -> RankDataStream:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ShardLengths:
    """Memoised sample counts from shard metadata (checked against the run's expectations)."""

    def __init__(self, expect: shards.ShardExpectations) -> None:
        self._expect = expect
        self._known: dict[Path, int] = {}

    def __call__(self, path: Path) -> int:
        if path not in self._known:
            self._known[path] = shards.inspect_shard(path, self._expect).num_samples
        return self._known[path]

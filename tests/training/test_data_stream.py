"""Per-rank shard assignment and the resumable data position."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from trainium_training import shards
from trainium_training.data_stream import (
    DataPosition,
    RankDataStream,
    ShardLengths,
    ShardPlan,
    position_after,
)
from trainium_training.make_shards import ShardSpec, generate_arrays, write_shard

pytestmark = pytest.mark.training

EXPECT = shards.ShardExpectations(vocab_size=512, max_seq_len=64, min_samples=3)
BATCH = 3


@pytest.fixture(scope="module")
def uneven_shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ...]:
    """Five shards of different lengths (7..15 samples: 2..5 batches of 3, with tails)."""
    folder = tmp_path_factory.mktemp("uneven")
    paths = []
    for index, samples in enumerate((7, 10, 15, 9, 12)):
        spec = ShardSpec(
            samples_per_shard=samples, seq_len=16, max_pred=3, vocab_size=512, seed=index
        )
        path = folder / f"u_training_{index}.hdf5"
        write_shard(path, generate_arrays(spec, index))
        paths.append(path)
    return tuple(paths)


def plans(files: tuple[Path, ...], world: int, seed: int = 7) -> list[ShardPlan]:
    return [ShardPlan(files, world, rank, seed) for rank in range(world)]


def test_ranks_read_distinct_shards_in_every_round(uneven_shards: tuple[Path, ...]) -> None:
    rank_plans = plans(uneven_shards, world=2)
    assert rank_plans[0].rounds_per_epoch == 2
    for epoch in range(3):
        read = [p.shard_for(epoch, r) for p in rank_plans for r in range(p.rounds_per_epoch)]
        assert len(set(read)) == len(read), f"epoch {epoch} reads a shard twice"


def test_every_rank_agrees_on_the_epoch_order_and_it_changes_per_epoch(
    uneven_shards: tuple[Path, ...],
) -> None:
    rank0, rank1 = plans(uneven_shards, world=2)
    assert rank0.epoch_order(0) == rank1.epoch_order(0)
    assert rank0.epoch_order(0) != rank0.epoch_order(1)
    assert sorted(rank0.epoch_order(3)) == sorted(uneven_shards)


def test_fewer_shards_than_ranks_is_refused_with_the_counts(
    uneven_shards: tuple[Path, ...],
) -> None:
    with pytest.raises(shards.ShardFormatError, match="holds 5 training shards but the job runs 8"):
        ShardPlan(uneven_shards, 8, 0, 1)


def take(stream: RankDataStream, count: int) -> list[np.ndarray]:
    return [next(stream).input_ids for _ in range(count)]


@pytest.mark.parametrize("consumed", [0, 1, 2, 4, 5, 9, 13])
def test_a_position_recomputed_from_a_count_continues_the_stream_exactly(
    uneven_shards: tuple[Path, ...], consumed: int
) -> None:
    """The resume invariant: fast-forwarding by count == having iterated that far."""
    for plan in plans(uneven_shards, world=2):
        with RankDataStream(plan, BATCH, EXPECT, DataPosition()) as continuous:
            take(continuous, consumed)
            expected_position = continuous.position
            expected_next = take(continuous, 6)
        position = position_after(plan, ShardLengths(EXPECT), BATCH, consumed)
        assert position == expected_position
        with RankDataStream(plan, BATCH, EXPECT, position, prefetch=False) as resumed:
            assert all(
                np.array_equal(a, b) for a, b in zip(take(resumed, 6), expected_next, strict=True)
            )


def test_the_stream_drops_shard_tails_and_crosses_into_the_next_epoch(
    uneven_shards: tuple[Path, ...],
) -> None:
    plan = ShardPlan(uneven_shards, 2, 0, 7)
    lengths = ShardLengths(EXPECT)
    per_epoch = sum(lengths(plan.shard_for(0, r)) // BATCH for r in range(plan.rounds_per_epoch))
    with RankDataStream(plan, BATCH, EXPECT, DataPosition()) as stream:
        positions = [next(stream).position for _ in range(per_epoch + 1)]
    assert positions[-1] == DataPosition(epoch=1, round=0, batch=0)
    assert {p.epoch for p in positions[:-1]} == {0}
    batches = [list(g) for _, g in itertools.groupby(positions[:-1], key=lambda p: p.round)]
    assert [len(b) for b in batches] == [
        lengths(plan.shard_for(0, r)) // BATCH for r in range(plan.rounds_per_epoch)
    ]


def test_micro_batches_carry_model_inputs_with_static_shapes(
    uneven_shards: tuple[Path, ...],
) -> None:
    with RankDataStream(ShardPlan(uneven_shards, 1, 0, 3), BATCH, EXPECT, DataPosition()) as stream:
        batch = next(stream)
    arrays = batch.arrays()
    assert set(arrays) == {
        "input_ids",
        "attention_mask",
        "token_type_ids",
        "labels",
        "next_sentence_label",
    }
    assert arrays["input_ids"].shape == arrays["labels"].shape == (BATCH, 16)
    assert arrays["next_sentence_label"].shape == (BATCH,)
    labelled = arrays["labels"] != shards.IGNORE_INDEX
    assert labelled.any()
    assert not labelled[:, 0].any()


def test_a_malformed_shard_met_mid_stream_stops_it_with_the_file_named(tmp_path: Path) -> None:
    good = ShardSpec(samples_per_shard=6, seq_len=16, max_pred=3, vocab_size=512)
    write_shard(tmp_path / "m_training_0.hdf5", generate_arrays(good, 0))
    broken = generate_arrays(good, 1)
    broken["input_ids"][0, 0] = 9999
    write_shard(tmp_path / "m_training_1.hdf5", broken)
    plan = ShardPlan(tuple(shards.list_training_shards(tmp_path)), 1, 0, 0)
    with RankDataStream(plan, BATCH, EXPECT, DataPosition()) as stream:  # noqa: SIM117
        with pytest.raises(shards.ShardFormatError, match=r"m_training_1\.hdf5: key 'input_ids'"):
            take(stream, 4)

"""The HDF5 shard format: the generator writes the tutorial's layout, the reader refuses others."""

from __future__ import annotations

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from training.training_helpers import CHECK_SHARDS, MAKE_SHARDS, child_env, run
from trainium_training import shards
from trainium_training.make_shards import (
    CLS_ID,
    MASK_ID,
    PAD_ID,
    SEP_ID,
    ShardSpec,
    generate_arrays,
    make_shards,
    write_shard,
)

pytestmark = pytest.mark.training

SPEC = ShardSpec(num_shards=1, samples_per_shard=16, seq_len=32, max_pred=5, vocab_size=1024)
EXPECT = shards.ShardExpectations(vocab_size=1024, max_seq_len=128)


@pytest.fixture
def good_arrays() -> dict[str, np.ndarray]:
    return generate_arrays(SPEC, 0)


def write(tmp_path: Path, arrays: dict[str, np.ndarray], name: str = "x_training_0.hdf5") -> Path:
    path = tmp_path / name
    write_shard(path, arrays)
    return path


def test_generated_shard_has_the_tutorials_keys_shapes_and_dtypes(tmp_path: Path) -> None:
    (path,) = make_shards(tmp_path, SPEC)
    with h5py.File(path, "r") as handle:
        layout = {key: (handle[key].shape, handle[key].dtype) for key in handle}
    n, seq, pred = SPEC.samples_per_shard, SPEC.seq_len, SPEC.max_pred
    assert layout == {
        "input_ids": ((n, seq), np.dtype("int32")),
        "input_mask": ((n, seq), np.dtype("int8")),
        "segment_ids": ((n, seq), np.dtype("int8")),
        "masked_lm_positions": ((n, pred), np.dtype("int32")),
        "masked_lm_ids": ((n, pred), np.dtype("int32")),
        "next_sentence_labels": ((n,), np.dtype("int8")),
    }
    assert path.name == "synthetic_training_0.hdf5"


def test_generated_samples_are_well_formed_bert_pairs(good_arrays: dict[str, np.ndarray]) -> None:
    ids, mask, segments = (good_arrays[k] for k in ("input_ids", "input_mask", "segment_ids"))
    positions, labels = good_arrays["masked_lm_positions"], good_arrays["masked_lm_ids"]
    for row in range(SPEC.samples_per_shard):
        length = int(mask[row].sum())
        assert ids[row, 0] == CLS_ID
        assert ids[row, length - 1] == SEP_ID
        assert (ids[row, length:] == PAD_ID).all()
        assert (mask[row, :length] == 1).all()
        assert (mask[row, length:] == 0).all()
        seps = np.flatnonzero(ids[row, :length] == SEP_ID)
        assert len(seps) == 2
        assert (segments[row, : seps[0] + 1] == 0).all()
        assert (segments[row, seps[0] + 1 : length] == 1).all()
        count = int((positions[row] > 0).sum())
        used = positions[row, :count]
        assert count >= 1
        assert (np.diff(used) > 0).all(), "positions are sorted and distinct"
        assert (positions[row, count:] == 0).all()
        assert (labels[row, count:] == 0).all()
        assert not set(used.tolist()) & {0, *seps.tolist()}, "never [CLS] or [SEP]"
        assert (used < length).all(), "never padding"
        assert (labels[row, :count] >= 104).all(), "labels are the original regular tokens"
    assert (ids == MASK_ID).any()
    assert set(np.unique(good_arrays["next_sentence_labels"]).tolist()) <= {0, 1}


def test_distinct_samples_repeat_the_same_rows_in_every_shard() -> None:
    spec = ShardSpec(
        samples_per_shard=12, seq_len=16, max_pred=3, vocab_size=512, distinct_samples=3
    )
    first, second = generate_arrays(spec, 0), generate_arrays(spec, 1)
    assert np.array_equal(first["input_ids"], second["input_ids"])
    assert len({row.tobytes() for row in first["input_ids"]}) == 3


def test_masked_lm_labels_place_original_ids_and_ignore_the_rest() -> None:
    positions = np.array([[2, 5, 0, 0]], dtype=np.int64)
    ids = np.array([[700, 800, 0, 0]], dtype=np.int64)
    labels = shards.masked_lm_labels(positions, ids, seq_len=8)
    expected = np.full((1, 8), shards.IGNORE_INDEX)
    expected[0, 2], expected[0, 5] = 700, 800
    assert np.array_equal(labels, expected)


def test_reader_returns_the_written_values(
    tmp_path: Path, good_arrays: dict[str, np.ndarray]
) -> None:
    shard = shards.read_shard(write(tmp_path, good_arrays), EXPECT)
    assert shard.num_samples == SPEC.samples_per_shard
    assert shard.seq_len == SPEC.seq_len
    assert np.array_equal(shard.input_ids, good_arrays["input_ids"])
    assert shard.input_mask.dtype == np.int64


@pytest.mark.parametrize(
    ("mutate", "expected_parts"),
    [
        pytest.param(
            lambda a: a.pop("masked_lm_ids"),
            ["key 'masked_lm_ids'", "missing", "(num_samples, max_pred)", "int32"],
            id="missing-key",
        ),
        pytest.param(
            lambda a: a.update(input_mask=a["input_mask"].astype(np.float32)),
            ["key 'input_mask'", "float32", "integer dtype", "int8"],
            id="float-dtype",
        ),
        pytest.param(
            lambda a: a.update(segment_ids=a["segment_ids"][:-1]),
            ["key 'segment_ids'", "(15, 32)", "expected (16, 32)"],
            id="row-count",
        ),
        pytest.param(
            lambda a: a.update(masked_lm_ids=a["masked_lm_ids"][:, :-1]),
            ["key 'masked_lm_ids'", "(16, 4)", "expected (16, 5)"],
            id="prediction-width",
        ),
        pytest.param(
            lambda a: a.update(input_ids=a["input_ids"].reshape(-1)),
            ["key 'input_ids'", "(512,)", "(num_samples, seq_len)"],
            id="flat-input-ids",
        ),
        pytest.param(
            lambda a: a["input_ids"].__setitem__((3, 1), 5000),
            ["key 'input_ids'", "holds 5000", "[0, 1023]"],
            id="token-outside-vocabulary",
        ),
        pytest.param(
            lambda a: a["masked_lm_positions"].__setitem__((0, 0), 32),
            ["key 'masked_lm_positions'", "holds 32", "[0, 31]"],
            id="position-outside-sequence",
        ),
        pytest.param(
            lambda a: a["next_sentence_labels"].__setitem__(0, 2),
            ["key 'next_sentence_labels'", "holds 2", "[0, 1]"],
            id="bad-label",
        ),
    ],
)
def test_reader_refuses_malformed_shards_naming_file_key_and_expectation(
    tmp_path: Path, good_arrays: dict[str, np.ndarray], mutate: object, expected_parts: list[str]
) -> None:
    mutate(good_arrays)  # type: ignore[operator]
    path = write(tmp_path, good_arrays)
    with pytest.raises(shards.ShardFormatError) as caught:
        shards.read_shard(path, EXPECT)
    message = str(caught.value)
    assert str(path) in message
    for part in expected_parts:
        assert part in message


def test_reader_refuses_sequences_longer_than_the_model_allows(
    tmp_path: Path, good_arrays: dict[str, np.ndarray]
) -> None:
    expect = shards.ShardExpectations(vocab_size=1024, max_seq_len=16)
    with pytest.raises(shards.ShardFormatError, match="max_position_embeddings 16"):
        shards.read_shard(write(tmp_path, good_arrays), expect)


def test_reader_refuses_a_shard_shorter_than_one_batch(
    tmp_path: Path, good_arrays: dict[str, np.ndarray]
) -> None:
    expect = shards.ShardExpectations(vocab_size=1024, max_seq_len=128, min_samples=64)
    with pytest.raises(shards.ShardFormatError, match="16 samples, fewer than one batch of 64"):
        shards.inspect_shard(write(tmp_path, good_arrays), expect)


def test_reader_refuses_a_file_that_is_not_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "bad_training_0.hdf5"
    path.write_text("not hdf5")
    with pytest.raises(shards.ShardFormatError, match="not a readable HDF5 file") as caught:
        shards.inspect_shard(path)
    assert str(path) in str(caught.value)


def test_listing_finds_training_shards_sorted_and_ignores_other_files(tmp_path: Path) -> None:
    for name in (
        "b_training_1.hdf5",
        "a_training_0.hdf5",
        "a_test_0.hdf5",
        ".a_training_2.hdf5.partial-1",
    ):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in shards.list_training_shards(tmp_path)] == [
        "a_training_0.hdf5",
        "b_training_1.hdf5",
    ]


def test_listing_an_empty_folder_says_how_to_get_shards(tmp_path: Path) -> None:
    with pytest.raises(shards.ShardFormatError, match=r"no files match \*_training_\*\.hdf5"):
        shards.list_training_shards(tmp_path)
    with pytest.raises(shards.ShardFormatError, match="not a directory"):
        shards.list_training_shards(tmp_path / "absent")


def test_make_shards_cli_writes_shards_when_run_as_a_file(tmp_path: Path) -> None:
    result = run(
        [
            sys.executable,
            str(MAKE_SHARDS),
            "--output_dir",
            str(tmp_path),
            "--num_shards",
            "2",
            "--samples_per_shard",
            "8",
            "--seq_len",
            "16",
            "--max_pred",
            "3",
            "--vocab_size",
            "512",
        ],
        child_env(),
    )
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "synthetic_training_0.hdf5",
        "synthetic_training_1.hdf5",
    ]


def test_make_shards_cli_rejects_impossible_shapes_with_every_problem(tmp_path: Path) -> None:
    result = run(
        [
            sys.executable,
            str(MAKE_SHARDS),
            "--output_dir",
            str(tmp_path),
            "--seq_len",
            "4",
            "--vocab_size",
            "50",
        ],
        child_env(),
    )
    assert result.returncode == 2
    assert "--seq_len must be >= 8 (got 4)" in result.stderr
    assert "--vocab_size must be > 105" in result.stderr
    assert not list(tmp_path.iterdir())


def test_check_shards_reports_every_bad_shard_and_a_layout_mismatch(tmp_path: Path) -> None:
    make_shards(
        tmp_path,
        ShardSpec(num_shards=2, samples_per_shard=8, seq_len=16, max_pred=3, vocab_size=512),
    )
    odd = ShardSpec(samples_per_shard=8, seq_len=32, max_pred=3, vocab_size=512)
    write_shard(tmp_path / "odd_training_0.hdf5", generate_arrays(odd, 0))
    broken = generate_arrays(odd, 1)
    del broken["input_mask"]
    write_shard(tmp_path / "zz_training_9.hdf5", broken)

    result = run([sys.executable, str(CHECK_SHARDS), "--data_dir", str(tmp_path)], child_env())

    assert result.returncode == 1
    assert "zz_training_9.hdf5: key 'input_mask': missing" in result.stderr
    assert "shards disagree on their layout" in result.stderr
    assert "seq_len 16 / max_pred 3: 2 shards" in result.stderr
    assert "4 shards, 24 readable samples" in result.stdout


def test_check_shards_accepts_generated_shards(tmp_path: Path) -> None:
    make_shards(
        tmp_path,
        ShardSpec(num_shards=2, samples_per_shard=8, seq_len=16, max_pred=3, vocab_size=512),
    )
    result = run([sys.executable, str(CHECK_SHARDS), "--data_dir", str(tmp_path)], child_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "2 shards, 16 readable samples (seq_len 16, max_pred 3)"

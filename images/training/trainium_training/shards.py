"""The HDF5 shard format of the BERT phase-1 pretraining data, and a reader that checks it.

The format is the one the reference tutorial consumes (NVIDIA DeepLearningExamples'
wikicorpus preparation): one file per shard, six datasets of `num_samples` rows each.

| key | shape | dtype written by the prep script |
|---|---|---|
| `input_ids` | (num_samples, seq_len) | int32 |
| `input_mask` | (num_samples, seq_len) | int8, 1 = real token, 0 = padding |
| `segment_ids` | (num_samples, seq_len) | int8, 0 = sentence A, 1 = sentence B |
| `masked_lm_positions` | (num_samples, max_pred) | int32, 0-padded at the end |
| `masked_lm_ids` | (num_samples, max_pred) | int32, original token at each position |
| `next_sentence_labels` | (num_samples,) | int8, 0 = B follows A, 1 = B is random |

Position 0 always holds [CLS] and is never masked, so a 0 in `masked_lm_positions` marks
padding. Readers accept any integer dtype (other tools write int64) but refuse anything else,
with a message naming the file, the key and what was expected.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

import h5py
import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]

INPUT_IDS: Final = "input_ids"
INPUT_MASK: Final = "input_mask"
SEGMENT_IDS: Final = "segment_ids"
MASKED_LM_POSITIONS: Final = "masked_lm_positions"
MASKED_LM_IDS: Final = "masked_lm_ids"
NEXT_SENTENCE_LABELS: Final = "next_sentence_labels"

SHARD_DTYPES: Final[dict[str, np.dtype[np.signedinteger]]] = {
    INPUT_IDS: np.dtype(np.int32),
    INPUT_MASK: np.dtype(np.int8),
    SEGMENT_IDS: np.dtype(np.int8),
    MASKED_LM_POSITIONS: np.dtype(np.int32),
    MASKED_LM_IDS: np.dtype(np.int32),
    NEXT_SENTENCE_LABELS: np.dtype(np.int8),
}
"""Every key of a shard, with the dtype the tutorial's preparation script writes."""

SEQUENCE_KEYS: Final = (INPUT_IDS, INPUT_MASK, SEGMENT_IDS)
PREDICTION_KEYS: Final = (MASKED_LM_POSITIONS, MASKED_LM_IDS)

IGNORE_INDEX: Final = -100
"""Label value that the loss ignores (PyTorch's CrossEntropyLoss default)."""

TRAINING_SHARD_GLOB: Final = "*_training_*.hdf5"
"""Files of the training split, as the wikicorpus preparation names them."""


class ShardFormatError(ValueError):
    """A shard does not have the tutorial's HDF5 layout; the message names file and key."""


@dataclass(frozen=True)
class ShardShape:
    """What a shard's metadata says, read without loading the data."""

    path: Path
    num_samples: int
    seq_len: int
    max_pred: int


@dataclass(frozen=True)
class ShardExpectations:
    """Limits a shard must meet to be used with a given model and run."""

    vocab_size: int
    max_seq_len: int  # the model's max_position_embeddings
    seq_len: int | None = None  # if set, the shard's sequence length must equal it
    max_pred: int | None = None  # if set, the shard's masked-LM width must equal it
    min_samples: int = 1  # a shard shorter than one batch would never yield a batch


@dataclass(frozen=True)
class Shard:
    """A shard's arrays, checked, in the integer width the model consumes."""

    path: Path
    input_ids: IntArray
    input_mask: IntArray
    segment_ids: IntArray
    masked_lm_positions: IntArray
    masked_lm_ids: IntArray
    next_sentence_labels: IntArray

    @property
    def num_samples(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])


def _fail(path: Path, key: str | None, problem: str) -> ShardFormatError:
    where = f"{path}: key '{key}'" if key else f"{path}"
    return ShardFormatError(f"{where}: {problem}")


def _expected_layout(key: str) -> str:
    dims = {
        INPUT_IDS: "(num_samples, seq_len)",
        INPUT_MASK: "(num_samples, seq_len)",
        SEGMENT_IDS: "(num_samples, seq_len)",
        MASKED_LM_POSITIONS: "(num_samples, max_pred)",
        MASKED_LM_IDS: "(num_samples, max_pred)",
        NEXT_SENTENCE_LABELS: "(num_samples,)",
    }[key]
    return f"expected shape {dims} with an integer dtype (the tutorial writes {SHARD_DTYPES[key]})"


def inspect_shard(path: Path, expect: ShardExpectations | None = None) -> ShardShape:
    """Check keys, shapes and dtypes from the file's metadata only (no data is read)."""
    try:
        handle = h5py.File(path, "r")
    except FileNotFoundError:
        raise _fail(path, None, "file not found") from None
    except OSError as exc:
        raise _fail(path, None, f"not a readable HDF5 file ({exc})") from None
    with handle:
        shapes: dict[str, tuple[int, ...]] = {}
        for key in SHARD_DTYPES:
            if key not in handle:
                present = ", ".join(sorted(handle.keys())) or "none"
                raise _fail(
                    path, key, f"missing ({_expected_layout(key)}; keys present: {present})"
                )
            dataset = handle[key]
            if not isinstance(dataset, h5py.Dataset):
                raise _fail(path, key, f"is a group, not a dataset ({_expected_layout(key)})")
            if not np.issubdtype(dataset.dtype, np.integer):
                raise _fail(path, key, f"has dtype {dataset.dtype}; {_expected_layout(key)}")
            shapes[key] = tuple(int(d) for d in dataset.shape)
    return _check_shapes(path, shapes, expect)


def _check_shapes(
    path: Path, shapes: dict[str, tuple[int, ...]], expect: ShardExpectations | None
) -> ShardShape:
    ids_shape = shapes[INPUT_IDS]
    if len(ids_shape) != 2 or ids_shape[1] < 2:
        raise _fail(path, INPUT_IDS, f"has shape {ids_shape}; {_expected_layout(INPUT_IDS)}")
    num_samples, seq_len = ids_shape
    pred_shape = shapes[MASKED_LM_POSITIONS]
    if len(pred_shape) != 2:
        raise _fail(
            path,
            MASKED_LM_POSITIONS,
            f"has shape {pred_shape}; {_expected_layout(MASKED_LM_POSITIONS)}",
        )
    max_pred = pred_shape[1]
    wanted = {
        INPUT_MASK: (num_samples, seq_len),
        SEGMENT_IDS: (num_samples, seq_len),
        MASKED_LM_IDS: (num_samples, max_pred),
        NEXT_SENTENCE_LABELS: (num_samples,),
        MASKED_LM_POSITIONS: (num_samples, max_pred),
    }
    for key, shape in wanted.items():
        if shapes[key] != shape:
            raise _fail(
                path,
                key,
                f"has shape {shapes[key]}, expected {shape} to match "
                f"{INPUT_IDS} {ids_shape} and {MASKED_LM_POSITIONS} width {max_pred}",
            )
    if expect is not None:
        _check_expectations(path, num_samples, seq_len, max_pred, expect)
    return ShardShape(path=path, num_samples=num_samples, seq_len=seq_len, max_pred=max_pred)


def _check_expectations(
    path: Path, num_samples: int, seq_len: int, max_pred: int, expect: ShardExpectations
) -> None:
    if expect.seq_len is not None and seq_len != expect.seq_len:
        raise _fail(
            path,
            INPUT_IDS,
            f"has sequence length {seq_len} but --seq_len is {expect.seq_len}; "
            "pass the data's sequence length or use shards prepared for it",
        )
    if seq_len > expect.max_seq_len:
        raise _fail(
            path,
            INPUT_IDS,
            f"has sequence length {seq_len}, longer than the model's "
            f"max_position_embeddings {expect.max_seq_len}; choose a larger --model_config",
        )
    if expect.max_pred is not None and max_pred != expect.max_pred:
        raise _fail(
            path,
            MASKED_LM_POSITIONS,
            f"has width {max_pred} but --max_pred_len is {expect.max_pred}",
        )
    if num_samples < expect.min_samples:
        raise _fail(
            path,
            INPUT_IDS,
            f"holds {num_samples} samples, fewer than one batch of {expect.min_samples}; "
            "lower --batch_size or remove the shard",
        )


def read_shard(path: Path, expect: ShardExpectations) -> Shard:
    """Load and check a whole shard: layout first, then the values the model depends on."""
    inspect_shard(path, expect)
    with h5py.File(path, "r") as handle:
        arrays = {key: np.asarray(handle[key][()], dtype=np.int64) for key in SHARD_DTYPES}
    shard = Shard(path=path, **arrays)
    check_values(shard, expect.vocab_size)
    return shard


def _check_range(path: Path, key: str, values: IntArray, *, low: int, high: int, why: str) -> None:
    """Every value must lie in [low, high)."""
    if values.size == 0:
        return
    smallest, largest = int(values.min()), int(values.max())
    if smallest < low or largest >= high:
        bad = smallest if smallest < low else largest
        raise _fail(path, key, f"holds {bad}; values must be in [{low}, {high - 1}] ({why})")


def check_values(shard: Shard, vocab_size: int) -> None:
    """Refuse values that would index out of the model's tables or mean nothing."""
    path = shard.path
    checks = (
        (INPUT_IDS, shard.input_ids, vocab_size, "token ids of the model's vocabulary"),
        (MASKED_LM_IDS, shard.masked_lm_ids, vocab_size, "token ids of the model's vocabulary"),
        (INPUT_MASK, shard.input_mask, 2, "1 = token, 0 = padding"),
        (SEGMENT_IDS, shard.segment_ids, 2, "0 = sentence A, 1 = sentence B"),
        (NEXT_SENTENCE_LABELS, shard.next_sentence_labels, 2, "0 = is next, 1 = random"),
        (MASKED_LM_POSITIONS, shard.masked_lm_positions, shard.seq_len, "0-padded positions"),
    )
    for key, values, high, why in checks:
        _check_range(path, key, values, low=0, high=high, why=why)


def masked_lm_labels(positions: IntArray, ids: IntArray, seq_len: int) -> IntArray:
    """Dense per-token labels: the original token at masked positions, IGNORE_INDEX elsewhere.

    Shapes stay static (good for XLA): padded entries (position 0) all land on the [CLS]
    slot, which is then reset, since [CLS] is never a prediction target.
    """
    labels = np.full((positions.shape[0], seq_len), IGNORE_INDEX, dtype=np.int64)
    np.put_along_axis(labels, positions, ids, axis=1)
    labels[:, 0] = IGNORE_INDEX
    return labels


def list_training_shards(data_dir: Path) -> list[Path]:
    """The training shards of `data_dir`, sorted by name (the order every rank agrees on)."""
    if not data_dir.is_dir():
        raise ShardFormatError(
            f"--data_dir {data_dir}: not a directory; point it at the folder holding "
            f"the {TRAINING_SHARD_GLOB} shards"
        )
    files = sorted(p for p in data_dir.glob(TRAINING_SHARD_GLOB) if p.is_file())
    if not files:
        raise ShardFormatError(
            f"--data_dir {data_dir}: no files match {TRAINING_SHARD_GLOB}; generate synthetic "
            "shards with make_shards.py or copy the tutorial's wikicorpus shards there"
        )
    return files

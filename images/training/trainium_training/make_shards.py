"""Write synthetic pretraining shards in the tutorial's HDF5 format (for tests and demos).

    python -m trainium_training.make_shards --output_dir /data/synthetic --num_shards 64

Each sample looks like a prepared wikicorpus sample: `[CLS] A [SEP] B [SEP]` then padding,
segment ids 0/1 for the two sentences, about 15% of the tokens chosen for masked-LM (80%
replaced by [MASK], 10% by a random token, 10% kept), their positions and original ids padded
with 0 to `max_pred`, and a random next-sentence label. Token ids are random, so the data
only exercises the pipeline; `--distinct_samples` repeats a few samples so a model can
memorise them (the loss then falls quickly).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

if __name__ == "__main__" and not __package__:
    # Run as a file (python .../make_shards.py): import the package from its parent folder
    # instead of letting this folder's modules shadow top-level ones.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

import h5py
import numpy as np
import numpy.typing as npt

from trainium_training import shards

Arrays = dict[str, npt.NDArray[Any]]

PAD_ID: Final = 0
CLS_ID: Final = 101
SEP_ID: Final = 102
MASK_ID: Final = 103
FIRST_REGULAR_ID: Final = 104
"""Special tokens at the ids of the BERT uncased vocabulary; regular tokens come after them."""

MASKED_LM_FRACTION: Final = 0.15
MIN_SEQ_LEN: Final = 8


@dataclass(frozen=True)
class ShardSpec:
    """What to generate."""

    num_shards: int = 4
    samples_per_shard: int = 256
    seq_len: int = 128
    max_pred: int = 20
    vocab_size: int = 30522
    seed: int = 0
    distinct_samples: int = 0  # 0 = every sample distinct; N = cycle through N samples
    prefix: str = "synthetic"

    def problems(self) -> list[str]:
        found = []
        if self.num_shards < 1:
            found.append(f"--num_shards must be >= 1 (got {self.num_shards})")
        if self.samples_per_shard < 1:
            found.append(f"--samples_per_shard must be >= 1 (got {self.samples_per_shard})")
        if self.seq_len < MIN_SEQ_LEN:
            found.append(f"--seq_len must be >= {MIN_SEQ_LEN} (got {self.seq_len})")
        if self.max_pred < 1 or self.max_pred > self.seq_len - 3:
            found.append(
                f"--max_pred must be in [1, seq_len - 3 = {self.seq_len - 3}] (got {self.max_pred})"
            )
        if self.vocab_size <= FIRST_REGULAR_ID + 1:
            found.append(
                f"--vocab_size must be > {FIRST_REGULAR_ID + 1} so that regular tokens exist "
                f"after the special ids (got {self.vocab_size})"
            )
        if self.distinct_samples < 0:
            found.append(f"--distinct_samples must be >= 0 (got {self.distinct_samples})")
        if not self.prefix or "/" in self.prefix:
            found.append(f"--prefix must be a non-empty file-name prefix (got {self.prefix!r})")
        return found


def shard_name(prefix: str, index: int) -> str:
    """A name that the training script's shard pattern matches."""
    return f"{prefix}_training_{index}.hdf5"


def _one_sample(rng: np.random.Generator, spec: ShardSpec) -> tuple[Arrays, int]:
    seq_len = spec.seq_len
    length = int(rng.integers(max(MIN_SEQ_LEN, seq_len // 2), seq_len + 1))
    len_a = int(rng.integers(1, length - 3))
    len_b = length - 3 - len_a
    regular = rng.integers(FIRST_REGULAR_ID, spec.vocab_size, size=len_a + len_b)
    tokens = np.full(seq_len, PAD_ID, dtype=np.int32)
    tokens[0] = CLS_ID
    tokens[1 : 1 + len_a] = regular[:len_a]
    tokens[1 + len_a] = SEP_ID
    tokens[2 + len_a : 2 + len_a + len_b] = regular[len_a:]
    tokens[length - 1] = SEP_ID
    segments = np.zeros(seq_len, dtype=np.int8)
    segments[2 + len_a : length] = 1
    mask = np.zeros(seq_len, dtype=np.int8)
    mask[:length] = 1

    candidates = np.array([i for i in range(1, length - 1) if i != 1 + len_a], dtype=np.int32)
    count = min(spec.max_pred, max(1, round(MASKED_LM_FRACTION * candidates.size)))
    chosen = np.sort(rng.choice(candidates, size=count, replace=False))
    originals = tokens[chosen].copy()
    action = rng.random(count)
    replaced = tokens.copy()
    replaced[chosen[action < 0.8]] = MASK_ID
    randomised = chosen[(action >= 0.8) & (action < 0.9)]
    replaced[randomised] = rng.integers(FIRST_REGULAR_ID, spec.vocab_size, size=randomised.size)

    positions = np.zeros(spec.max_pred, dtype=np.int32)
    ids = np.zeros(spec.max_pred, dtype=np.int32)
    positions[:count] = chosen
    ids[:count] = originals
    sample: Arrays = {
        shards.INPUT_IDS: replaced,
        shards.INPUT_MASK: mask,
        shards.SEGMENT_IDS: segments,
        shards.MASKED_LM_POSITIONS: positions,
        shards.MASKED_LM_IDS: ids,
    }
    return sample, int(rng.integers(0, 2))


def generate_arrays(spec: ShardSpec, shard_index: int) -> Arrays:
    """The six arrays of one shard, in the tutorial's dtypes."""
    rng = np.random.default_rng([spec.seed, shard_index])
    distinct = spec.distinct_samples or spec.samples_per_shard
    if spec.distinct_samples:
        # Repeated samples are the same across shards too, so a memorising model sees them all.
        rng = np.random.default_rng([spec.seed])
    base = [_one_sample(rng, spec) for _ in range(min(distinct, spec.samples_per_shard))]
    rows = [base[i % len(base)] for i in range(spec.samples_per_shard)]
    arrays = {
        key: np.stack([sample[key] for sample, _ in rows]).astype(dtype)
        for key, dtype in shards.SHARD_DTYPES.items()
        if key != shards.NEXT_SENTENCE_LABELS
    }
    arrays[shards.NEXT_SENTENCE_LABELS] = np.array(
        [label for _, label in rows], dtype=shards.SHARD_DTYPES[shards.NEXT_SENTENCE_LABELS]
    )
    return arrays


def write_shard(path: Path, arrays: Arrays) -> None:
    """Write atomically: a reader never sees a half-written file under the shard pattern."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with h5py.File(partial, "w") as handle:
            for key, values in arrays.items():
                handle.create_dataset(key, data=values, dtype=values.dtype, compression="gzip")
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def make_shards(output_dir: Path, spec: ShardSpec) -> list[Path]:
    """Generate `spec.num_shards` shards in `output_dir`; returns their paths."""
    problems = spec.problems()
    if problems:
        raise ValueError("; ".join(problems))
    written = []
    for index in range(spec.num_shards):
        path = output_dir / shard_name(spec.prefix, index)
        write_shard(path, generate_arrays(spec, index))
        written.append(path)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="make_shards",
        description="Write synthetic BERT pretraining shards in the tutorial's HDF5 format.",
    )
    defaults = ShardSpec()
    parser.add_argument("--output_dir", type=Path, required=True, help="folder for the shards")
    parser.add_argument("--num_shards", type=int, default=defaults.num_shards)
    parser.add_argument("--samples_per_shard", type=int, default=defaults.samples_per_shard)
    parser.add_argument("--seq_len", type=int, default=defaults.seq_len)
    parser.add_argument("--max_pred", type=int, default=defaults.max_pred)
    parser.add_argument("--vocab_size", type=int, default=defaults.vocab_size)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument(
        "--distinct_samples",
        type=int,
        default=defaults.distinct_samples,
        help="0 = all samples distinct; N = repeat N samples (a memorisable data set)",
    )
    parser.add_argument(
        "--prefix", default=defaults.prefix, help="file names: PREFIX_training_I.hdf5"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    spec = ShardSpec(
        num_shards=args.num_shards,
        samples_per_shard=args.samples_per_shard,
        seq_len=args.seq_len,
        max_pred=args.max_pred,
        vocab_size=args.vocab_size,
        seed=args.seed,
        distinct_samples=args.distinct_samples,
        prefix=args.prefix,
    )
    problems = spec.problems()
    if problems:
        parser.error("; ".join(problems))
    paths = make_shards(args.output_dir, spec)
    print(
        f"wrote {len(paths)} shards of {spec.samples_per_shard} samples "
        f"(seq_len {spec.seq_len}, max_pred {spec.max_pred}) to {args.output_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Check every training shard of a folder before a long run; report all problems at once.

    python -m trainium_training.check_shards --data_dir /data/bert_pretrain_..._seqlen128

Reads each `*_training_*.hdf5` shard fully with the same checks pretrain.py applies (keys,
shapes, dtypes, value ranges for the model's vocabulary and positions), and checks that all
shards share one sequence length and masked-LM width. Exits 1 if any shard is refused.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __name__ == "__main__" and not __package__:
    # Run as a file: import the package from its parent folder.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from trainium_training import shards

BERT_VOCAB_SIZE = 30522
BERT_MAX_POSITIONS = 512


def check_folder(data_dir: Path, expect: shards.ShardExpectations) -> tuple[list[str], str]:
    """Returns (problems, summary)."""
    problems: list[str] = []
    try:
        files = shards.list_training_shards(data_dir)
    except shards.ShardFormatError as exc:
        return [str(exc)], ""
    layouts: dict[tuple[int, int], list[Path]] = {}
    samples = 0
    for path in files:
        try:
            shard = shards.read_shard(path, expect)
        except shards.ShardFormatError as exc:
            problems.append(str(exc))
            continue
        samples += shard.num_samples
        width = int(shard.masked_lm_positions.shape[1])
        layouts.setdefault((shard.seq_len, width), []).append(path)
    if len(layouts) > 1:
        described = "; ".join(
            f"seq_len {seq} / max_pred {pred}: {len(paths)} shards (e.g. {paths[0].name})"
            for (seq, pred), paths in sorted(layouts.items())
        )
        problems.append(f"{data_dir}: shards disagree on their layout: {described}")
    layout = ", ".join(f"seq_len {s}, max_pred {p}" for s, p in sorted(layouts))
    summary = f"{len(files)} shards, {samples} readable samples ({layout or 'none readable'})"
    return problems, summary


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="check_shards", description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", type=Path, required=True)
    parser.add_argument("--vocab_size", type=int, default=BERT_VOCAB_SIZE)
    parser.add_argument(
        "--max_seq_len", type=int, default=BERT_MAX_POSITIONS, help="model max positions"
    )
    parser.add_argument("--batch_size", type=int, default=1, help="smallest usable shard")
    args = parser.parse_args(argv)
    expect = shards.ShardExpectations(
        vocab_size=args.vocab_size, max_seq_len=args.max_seq_len, min_samples=args.batch_size
    )
    problems, summary = check_folder(args.data_dir, expect)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    if summary:
        print(summary)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Fuzzing the rank-file reader: mutated and truncated real profiles, seeded and deterministic.

Run as a script (`python tests/profiler/fuzz_reader.py --cases N --seed S --memory-mib M`) it
caps its own address space with RLIMIT_AS, so an allocation the reader should have refused
fails as MemoryError, then reads every case with both decoders (the row reader, strict and
lenient, and the analysis layer's columnar one) and prints a JSON summary. Each case must end
in a parsed profile or a ProfileFormatError; anything else is listed with the case that
caused it, which `--case K` replays alone.

Mutations are of two kinds. Byte-level ones (bit flips, overwritten, inserted and deleted
bytes, truncation, extreme length fields) mostly meet a checksum. Structure-aware ones change a
block's decompressed payload or the header JSON and then re-seal it (lengths, zlib, crc32),
so the decoders themselves see hostile counts, varints, ids and shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import struct
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from profiler.profiler_helpers import HEADER, training_like_events
from trainium_operator.analysis.loading import load_rank_file
from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.format import (
    CODEC_NONE,
    CODEC_ZLIB,
    MAGIC,
    ProfileFormatError,
    RankFileWriter,
    read_rank_file,
)

_PREFIX = struct.Struct("<8sHHII")
_BLOCK = struct.Struct("<2sBBIII")
EXTREMES = (0, 1, 0x7F, 0x80, 0xFFFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 1 << 26)
HOSTILE_VARINTS = (
    b"\xff" * 12 + b"\x01",  # longer than 64 bits
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x01",  # 2^56
    b"\xff\xff\xff\xff\x0f",  # 2^32 - 1
    b"\x80\x80\x80\x80\x80\x01",  # 2^35
    b"\x7f",
    b"",
)
HOSTILE_JSON_VALUES: tuple[Any, ...] = (
    None,
    -1,
    2**40,
    2**70,
    1.5,
    True,
    "x",
    [],
    [1],
    [[1, 2]],
    {"a": 1},
)


FORMAT_1_FIXTURES = Path(__file__).parent / "fixtures" / "format-1.0"


def seed_files(directory: Path) -> list[bytes]:
    """Small real rank files from the profiler's own writer: several blocks, sync points,
    named tracks, both codecs, complete and still-being-written; and the format 1.0 files
    kept as fixtures, whose record layout the reader still decodes."""
    seeds: list[bytes] = []
    for index, (codec, count, block_events, finished) in enumerate(
        [
            (CODEC_ZLIB, 120, 32, True),
            (CODEC_NONE, 90, 40, True),
            (CODEC_ZLIB, 60, 60, False),
            (CODEC_ZLIB, 0, 8, True),
        ]
    ):
        path = directory / f"seed-{index}.trnprof"
        writer = RankFileWriter(path, HEADER, codec=codec, block_events=block_events)
        writer.name_track(77, -1, "main thread")
        events = training_like_events(count, seed=index)
        writer.write_events(events[: count // 2])
        writer.write_sync_points([ClockSyncPoint(2_000 + index, 1_700_000_000_000_002_000, 30)])
        writer.write_events(events[count // 2 :])
        if finished:
            writer.close(dropped_events=index)
        else:
            writer._file.close()  # type: ignore[union-attr]  # a crashed writer: no END block
            writer._file = None
        seeds.append(path.read_bytes())
    seeds.extend(p.read_bytes() for p in sorted(FORMAT_1_FIXTURES.glob("*.trnprof")))
    return seeds


def _blocks(data: bytes) -> list[tuple[int, int]]:
    """(offset, end) of each block of an intact file."""
    _, _, _, header_length, _ = _PREFIX.unpack_from(data)
    offset = _PREFIX.size + header_length
    spans = []
    while offset + _BLOCK.size <= len(data):
        _, _, _, stored, _, _ = _BLOCK.unpack_from(data, offset)
        end = offset + _BLOCK.size + stored
        spans.append((offset, end))
        offset = end
    return spans


def _seal_block(block_type: int, codec: int, payload: bytes, raw_len: int | None = None) -> bytes:
    stored = zlib.compress(payload) if codec == CODEC_ZLIB else payload
    meta = struct.pack(
        "<BBII", block_type, codec, len(stored), len(payload) if raw_len is None else raw_len
    )
    return b"BK" + meta + struct.pack("<I", zlib.crc32(stored, zlib.crc32(meta))) + stored


def _mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if not buf:
            break
        choice = rng.randrange(6)
        at = rng.randrange(len(buf))
        if choice == 0:
            buf[at] ^= 1 << rng.randrange(8)
        elif choice == 1:
            buf[at] = rng.randrange(256)
        elif choice == 2:
            buf[at:at] = rng.randbytes(rng.randint(1, 16))
        elif choice == 3:
            del buf[at : at + rng.randint(1, 32)]
        elif choice == 4 and at + 4 <= len(buf):
            struct.pack_into("<I", buf, at, rng.choice(EXTREMES))
        else:
            buf[at:at] = buf[rng.randrange(len(buf)) :][: rng.randint(1, 64)]
    return bytes(buf)


def _mutate_payload(rng: random.Random, payload: bytes) -> bytes:
    buf = bytearray(payload)
    for _ in range(rng.randint(1, 3)):
        at = rng.randrange(len(buf) + 1)
        choice = rng.randrange(5)
        if choice == 0 and buf:
            buf[min(at, len(buf) - 1)] = rng.randrange(256)
        elif choice == 1:
            buf[at:at] = rng.choice(HOSTILE_VARINTS)
        elif choice == 2:
            del buf[at : at + rng.randint(1, 8)]
        elif choice == 3:
            buf[at:at] = rng.randbytes(rng.randint(1, 8))
        else:
            buf[:0] = rng.choice(HOSTILE_VARINTS)  # the leading counts
    return bytes(buf)


def _mutate_structure(rng: random.Random, data: bytes) -> bytes:
    spans = _blocks(data)
    if not spans or rng.random() < 0.2:
        # The header JSON, re-sealed with a valid checksum.
        _, major, minor, length, _ = _PREFIX.unpack_from(data)
        header = json.loads(data[_PREFIX.size : _PREFIX.size + length])
        key = rng.choice([*header, "rank", "clock_sync", "extra"])
        header[key] = rng.choice(HOSTILE_JSON_VALUES)
        body = json.dumps(header).encode()
        return (
            _PREFIX.pack(MAGIC, major, minor, len(body), zlib.crc32(body))
            + (data[_PREFIX.size + length :])
        )
    start, end = rng.choice(spans)
    _, block_type, codec, _, _, _ = _BLOCK.unpack_from(data, start)
    stored = data[start + _BLOCK.size : end]
    payload = zlib.decompress(stored) if codec == CODEC_ZLIB else stored
    declared: int | None = None
    if rng.random() < 0.1:
        declared = rng.choice(EXTREMES)  # a raw length that does not match the payload
    mutated = _seal_block(block_type, codec, _mutate_payload(rng, payload), declared)
    return data[:start] + mutated + data[end:]


def make_case(rng: random.Random, seeds: list[bytes]) -> tuple[str, bytes]:
    data = rng.choice(seeds)
    kind = rng.random()
    if kind < 0.15:
        return "truncated", data[: rng.randrange(len(data))]
    if kind < 0.45:
        return "bytes", _mutate_bytes(rng, data)
    return "structure", _mutate_structure(rng, data)


def _readers(path: Path) -> list[tuple[str, Callable[[], object]]]:
    return [
        ("rows strict", lambda: read_rank_file(path)),
        ("rows lenient", lambda: read_rank_file(path, strict=False)),
        ("columns", lambda: load_rank_file(path)),
    ]


def run(cases: int, seed: int, only: int | None = None) -> dict[str, Any]:
    outcomes = {"parsed": 0, "refused": 0}
    failures: list[dict[str, Any]] = []
    kinds: dict[str, int] = {}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        seeds = seed_files(directory)
        rng = random.Random(seed)
        path = directory / "case.trnprof"
        for number in range(cases):
            kind, data = make_case(rng, seeds)
            if only is not None and number != only:
                continue
            kinds[kind] = kinds.get(kind, 0) + 1
            path.write_bytes(data)
            for reader, read in _readers(path):
                try:
                    read()
                except ProfileFormatError as exc:
                    outcomes["refused"] += 1
                    if str(path) not in str(exc):
                        failures.append({"case": number, "reader": reader, "error": "unnamed"})
                except BaseException as exc:  # exactly what the fuzzer hunts
                    failures.append(
                        {
                            "case": number,
                            "kind": kind,
                            "reader": reader,
                            "error": f"{type(exc).__name__}: {exc!s:.300}",
                            "traceback": traceback.format_exc(limit=4)[-1500:],
                        }
                    )
                else:
                    outcomes["parsed"] += 1
    return {
        "cases": sum(kinds.values()),
        "kinds": kinds,
        "outcomes": outcomes,
        "failures": failures[:20],
        "failure_count": len(failures),
        "seconds": round(time.perf_counter() - began, 2),
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=20)
    parser.add_argument("--memory-mib", type=int, default=0, help="extra address space allowed")
    parser.add_argument("--case", type=int, default=None, help="replay one case")
    args = parser.parse_args()
    if args.memory_mib:
        # Headroom above what the interpreter, numpy and the seeds already map.
        with open("/proc/self/status") as status:
            mapped_kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize"))
        limit = (mapped_kib << 10) + (args.memory_mib << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    print(json.dumps(run(args.cases, args.seed, args.case)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    raise SystemExit(main())

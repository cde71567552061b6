"""The reader's fuzz test (tests/profiler/fuzz_reader.py) as part of every run: 2,000 mutated
and truncated real rank files, seed 20, each read by the row reader (strict and lenient) and
the columnar decoder in a subprocess whose address space is capped at 256 MiB above what it
has mapped at start. Every case must end in a parsed profile or a ProfileFormatError naming
the file. About 3-5 s here. Before the reader's bounds, the same cases raised MemoryError
(under the cap), AttributeError and RecursionError; `fuzz_reader.py --case K` replays one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FUZZ_SCRIPT = Path(__file__).with_name("fuzz_reader.py")
CASES = int(os.environ.get("TRAINIUM_FUZZ_CASES", "2000"))
SEED = 20
MEMORY_MIB = 256


def test_every_mutated_profile_parses_or_raises_the_one_error_within_the_memory_bound() -> None:
    completed = subprocess.run(
        [
            sys.executable,
            str(FUZZ_SCRIPT),
            f"--cases={CASES}",
            f"--seed={SEED}",
            f"--memory-mib={MEMORY_MIB}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    summary = json.loads(completed.stdout)
    assert summary["failure_count"] == 0, json.dumps(summary["failures"], indent=1)[:6000]
    assert summary["cases"] == CASES
    # The fuzzer reaches both outcomes and every kind of mutation, or it tests nothing.
    assert set(summary["kinds"]) == {"bytes", "structure", "truncated"}
    assert summary["outcomes"]["parsed"] > CASES // 10, summary
    assert summary["outcomes"]["refused"] > CASES // 10, summary

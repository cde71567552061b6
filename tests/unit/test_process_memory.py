"""Freed heap memory goes back to the system (trainium_operator.process_memory)."""

from __future__ import annotations

import re
from pathlib import Path

from trainium_operator.process_memory import release_freed_memory

BLOCK = 64 * 1024  # below glibc's mmap threshold: each block lives in the heap


def resident_kib() -> int:
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def test_the_free_pages_in_the_middle_of_the_heap_are_released() -> None:
    blocks = [bytearray(BLOCK) for _ in range(1024)]  # 64 MiB, every page touched
    kept = blocks[1::2]  # the other half's pages stay free between them, where free() keeps them
    del blocks
    before = resident_kib()
    # free() alone gives none of it back: the pages lie between blocks still in use.
    assert release_freed_memory()
    released = before - resident_kib()
    assert released > 16 * 1024, f"released {released} KiB of the 32 MiB freed"
    assert len(kept) == 512

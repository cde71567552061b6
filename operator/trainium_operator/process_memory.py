"""Giving the memory a long-running process freed back to the system.

glibc's malloc keeps memory freed in the middle of its heap (it returns only the top of the
heap by itself): after a burst of large allocations, such as the operator's first lists of a
cluster or the UI composing a profile, a process keeps the burst's size resident until
`malloc_trim` releases the free pages.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_freed_memory() -> bool:
    """Releases the free pages of malloc's heaps; False where there is no malloc_trim (musl,
    macOS), where nothing happens."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True

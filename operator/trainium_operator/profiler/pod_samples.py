"""The pod directory where a pod's ranks meet (`channel_contract.POD_DIR`): every rank's
reporter writes its newest sample there, local rank 0's reads them to send one message for the
pod, and writes the operator's answer there for the others to read.

Everything in the directory is written by the job's own code, so a reader trusts none of it:
it opens only the names it expects (one per local rank, never a listing), never follows a
link nor blocks on a FIFO, reads at most MAX_SAMPLE_BYTES of a regular file, and skips a file
that is stale, malformed, of another job, attempt or node, or a rank already read.

Standard library only (the training image imports the profiler without our dependencies).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

from trainium_operator.contract import channel as contract

_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)


def write_atomically(path: str, data: bytes) -> None:
    """Writes `data` to `path` so a reader sees the old file or the new, never half of one."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    partial.write_bytes(data)
    partial.replace(target)


def read_fresh(path: str, limit: int, max_age_s: float, now: float | None = None) -> bytes | None:
    """The file's bytes if it is a regular file of at most `limit` bytes modified in the last
    `max_age_s` seconds; None otherwise (absent, stale, too large, a link, a FIFO, unreadable)."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        current = time.time() if now is None else now
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        if current - info.st_mtime > max_age_s:
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def _same_pod(sample: contract.ProgressMessage, own: contract.ProgressMessage) -> bool:
    return (sample.job, sample.namespace, sample.uid, sample.attempt, sample.node_rank) == (
        own.job,
        own.namespace,
        own.uid,
        own.attempt,
        own.node_rank,
    ) and sample.world_size == own.world_size


def read_samples(
    pod_dir: str,
    local_world_size: int,
    own: contract.ProgressMessage,
    max_age_s: float,
    now: float | None = None,
) -> list[contract.ProgressMessage]:
    """The fresh, well-formed samples of local ranks 1..local_world_size-1 (at most
    MAX_RANKS_PER_MESSAGE - 1 of them) that name `own`'s job, attempt and node and a rank not
    named yet; each costs at most one bounded read."""
    samples: list[contract.ProgressMessage] = []
    seen = {own.rank}
    for local_rank in range(1, min(local_world_size, contract.MAX_RANKS_PER_MESSAGE)):
        raw = read_fresh(
            contract.sample_file(pod_dir, local_rank), contract.MAX_SAMPLE_BYTES, max_age_s, now
        )
        if raw is None:
            continue
        try:
            sample = contract.parse_message(raw)
        except ValueError:
            continue
        if sample.rank in seen or not _same_pod(sample, own):
            continue
        seen.add(sample.rank)
        samples.append(sample)
    return samples


def write_answer(pod_dir: str, requests: object) -> None:
    """Local rank 0 passes the operator's requests on to its pod's other ranks."""
    body = requests if isinstance(requests, dict) else {}
    data = json.dumps({"requests": body}, separators=(",", ":")).encode()
    if len(data) <= contract.MAX_BODY_BYTES:
        write_atomically(contract.answer_file(pod_dir), data)


def read_answer(pod_dir: str, max_age_s: float, now: float | None = None) -> dict[str, Any]:
    """The operator's requests as local rank 0 last wrote them ({} when absent, stale or
    malformed)."""
    raw = read_fresh(contract.answer_file(pod_dir), contract.MAX_BODY_BYTES, max_age_s, now)
    if raw is None:
        return {}
    try:
        answer = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        return {}
    requests = answer.get("requests") if isinstance(answer, dict) else None
    return requests if isinstance(requests, dict) else {}

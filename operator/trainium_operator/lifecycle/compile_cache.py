"""status.compile.cache: what the native compile stage's pods said their NEFF caches hold.

Each compile pod ends with a summary in its termination message (contract/neff_cache.py); this
adds them up. A pod without one (an older image path, a message the kubelet could not keep,
a cache it could not list) is counted as not reported, so the figures never claim more than
was read.
"""

from __future__ import annotations

from trainium_operator.api.status import CompileCacheStatus
from trainium_operator.builders.job import JobRef
from trainium_operator.contract import neff_cache
from trainium_operator.lifecycle.observed import PodView

RANK_PLACEHOLDER = "<rank>"


def size_text(size: int) -> str:
    """Bytes in the largest binary unit that keeps a number of at least 1 (one decimal)."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def cache_path(job: JobRef) -> str:
    """Every rank's NEFF cache directory, the rank left as a placeholder."""
    return neff_cache.neff_dir(job.native_cache_dir(0)).replace(
        f"/{job.cache_set}_0/", f"/{job.cache_set}_{RANK_PLACEHOLDER}/"
    )


def compile_cache_view(job: JobRef, gang: dict[int, PodView]) -> CompileCacheStatus:
    """status.compile.cache from the succeeded compile gang's termination messages; figures
    nobody reported stay unset (absent), never zero."""
    summaries = [neff_cache.parse_summary(pod.termination_message) for pod in gang.values()]
    readable = [s for s in summaries if s is not None and s.readable]
    nodes = job.spec.nodes
    view = CompileCacheStatus(path=cache_path(job), nodes_reported=len(readable), nodes=nodes)
    if readable:
        programs = sum(s.programs or 0 for s in readable)
        size = sum(s.bytes or 0 for s in readable)
        partial = f" ({len(readable)} of {nodes} nodes)" if len(readable) < nodes else ""
        summary = f"{programs} programs, {size_text(size)}{partial}"
        view = view.model_copy(update={"programs": programs, "bytes": size, "summary": summary})
    missing = nodes - len(readable)
    if missing:
        unlisted = sum(1 for s in summaries if s is not None and not s.readable)
        reasons = []
        if unlisted:
            reasons.append(f"{unlisted} could not list their cache directory")
        if missing - unlisted:
            reasons.append(
                f"{missing - unlisted} left no cache summary in their termination message"
            )
        message = (
            f"{missing} of {nodes} compile pods did not report their NEFF cache: "
            + "; ".join(reasons)
        )
        view = view.model_copy(update={"message": message})
    return view

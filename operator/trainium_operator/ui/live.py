"""A TrainingJob's live progress and health as the UI's job list shows them (pure mapping).

The figures come from the job's status as the operator wrote it (status.progress, .stall,
.stragglers, .restarts, the Stalled and Restarting conditions; api/status.py). The status is
read leniently, field by field: a field of the wrong type, or one a newer operator added, is
left out of the row instead of failing the whole list. Every string is passed on as data; the
browser renders it as text.

One health state per job, the most urgent first:

- restarting: the gang is being replaced (phase Restarting, or the Restarting condition);
- stalled: no rank advanced for longer than the stall bound (the Stalled condition);
- straggler: some ranks are persistently slower than the rest (status.stragglers.ranks);
- healthy: training, none of the above;
- inactive: not training (pending, compiling, suspended, finished): nothing live to judge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from trainium_operator.api.status import TERMINAL_PHASES, ConditionType, Phase

Health = Literal["healthy", "stalled", "straggler", "restarting", "inactive"]
MAX_TEXT = 512  # a status string longer than this is cut: the list is a summary
MAX_STRAGGLERS_SHOWN = 4


@dataclass(frozen=True)
class StragglerRow:
    rank: int
    node: str | None
    step_time_ms: float | None
    ratio: float | None


@dataclass(frozen=True)
class RestartCounts:
    total: int = 0
    application: int = 0
    infrastructure: int = 0
    stall: int = 0


@dataclass(frozen=True)
class JobLive:
    """The live columns of one job's row: progress, restarts and the health state."""

    health: Health = "inactive"
    health_reason: str = ""
    step: int | None = None  # the slowest rank's step
    max_step: int | None = None  # the fastest rank's step
    total_steps: int | None = None
    step_time_p50_ms: float | None = None
    steps_per_second: float | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    eta: str | None = None
    eta_summary: str | None = None
    last_progress_time: str | None = None
    update_time: str | None = None
    ranks_reporting: int | None = None
    world_size: int | None = None
    restarts: RestartCounts = field(default_factory=RestartCounts)
    stragglers: tuple[StragglerRow, ...] = ()


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _text(value: Any) -> str | None:
    return value[:MAX_TEXT] if isinstance(value, str) and value else None


def _camel_case(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part[:1].upper() + part[1:] for part in rest)


_READ_OPTIONAL: dict[str, Callable[[Any], Any]] = {
    "int | None": _int,
    "float | None": _float,
    "str | None": _text,
}
# Each optional column of JobLive is status.progress's field of the same name in camelCase
# (step_time_p50_ms: stepTimeP50Ms), read by its type: (column, progress key, reader).
_PROGRESS_COLUMNS = tuple(
    (column.name, _camel_case(column.name), _READ_OPTIONAL[str(column.type)])
    for column in fields(JobLive)
    if str(column.type) in _READ_OPTIONAL
)


def _condition_true(status: Mapping[str, Any], kind: ConditionType) -> Mapping[str, Any] | None:
    conditions = status.get("conditions")
    for entry in conditions if isinstance(conditions, list) else []:
        condition = _mapping(entry)
        if condition.get("type") == kind.value and condition.get("status") == "True":
            return condition
    return None


def _has_condition(status: Mapping[str, Any], kind: ConditionType) -> bool:
    conditions = status.get("conditions")
    return any(
        _mapping(condition).get("type") == kind.value
        for condition in (conditions if isinstance(conditions, list) else [])
    )


def _same_attempt(part: Mapping[str, Any], status: Mapping[str, Any]) -> bool:
    """Figures of an earlier gang attempt are not about the gang running now."""
    theirs, current = _int(part.get("attempt")), _int(status.get("attempt"))
    return theirs is None or current is None or theirs == current


def restart_counts(status: Mapping[str, Any]) -> RestartCounts:
    restarts = _mapping(status.get("restarts"))
    return RestartCounts(
        total=_int(restarts.get("total")) or 0,
        application=_int(restarts.get("application")) or 0,
        infrastructure=_int(restarts.get("infrastructure")) or 0,
        stall=_int(restarts.get("stall")) or 0,
    )


def straggler_rows(status: Mapping[str, Any]) -> tuple[StragglerRow, ...]:
    """The current gang's stragglers, slowest first (as the operator ordered them)."""
    stragglers = _mapping(status.get("stragglers"))
    ranks = stragglers.get("ranks")
    if not _same_attempt(stragglers, status) or not isinstance(ranks, list):
        return ()
    rows = []
    for item in ranks:
        entry = _mapping(item)
        rank = _int(entry.get("rank"))
        if rank is None:
            continue
        rows.append(
            StragglerRow(
                rank=rank,
                node=_text(entry.get("node")),
                step_time_ms=_float(entry.get("stepTimeMs")),
                ratio=_float(entry.get("ratio")),
            )
        )
    return tuple(rows)


def _stalled(status: Mapping[str, Any]) -> bool:
    if _condition_true(status, ConditionType.STALLED) is not None:
        return True
    if _has_condition(status, ConditionType.STALLED):
        return False  # the operator said it is not (any more)
    # An operator that wrote status.stall but no condition: an unresolved stall of this gang.
    stall = _mapping(status.get("stall"))
    return bool(stall) and not stall.get("resolvedTime") and _same_attempt(stall, status)


def _stall_reason(status: Mapping[str, Any]) -> str:
    stall = _mapping(status.get("stall"))
    parts = []
    since = _text(stall.get("lastProgressTime"))
    bound = _float(stall.get("boundSeconds"))
    advanced = f"no rank advanced since {since}" if since else "no rank advanced"
    parts.append(f"{advanced} (bound {bound:g} s)" if bound is not None else advanced)
    stopped = stall.get("stoppedRanks")
    first = _mapping(stopped[0]) if isinstance(stopped, list) and stopped else {}
    rank = _int(first.get("rank"))
    if rank is not None:
        node = _text(first.get("node"))
        step = _int(first.get("step"))
        where = f" on {node}" if node else ""
        at = f" at step {step}" if step is not None else ""
        parts.append(f"stopped first: rank {rank}{where}{at}")
    action = _text(stall.get("action"))
    if action:
        parts.append(f"action {action}")
    if not stall:
        message = _text(_mapping(_condition_true(status, ConditionType.STALLED)).get("message"))
        return message or parts[0]
    return "; ".join(parts)


def _restart_reason(status: Mapping[str, Any], restarts: RestartCounts) -> str:
    failure = _mapping(status.get("lastFailure"))
    cause = _text(failure.get("class"))
    detail = _text(failure.get("reason")) or _text(status.get("reason"))
    parts = [f"restart {restarts.total}" if restarts.total else "restarting"]
    if cause:
        parts.append(f"after a {cause.lower()} failure")
    if detail:
        parts.append(f"({detail})")
    return " ".join(parts)


def _straggler_reason(rows: tuple[StragglerRow, ...]) -> str:
    described = []
    for row in rows[:MAX_STRAGGLERS_SHOWN]:
        where = f" on {row.node}" if row.node else ""
        ratio = f" {row.ratio:.2f}x the gang's step time" if row.ratio is not None else ""
        described.append(f"rank {row.rank}{where}{ratio}")
    more = len(rows) - MAX_STRAGGLERS_SHOWN
    return "; ".join(described) + (f"; {more} more" if more > 0 else "")


def job_health(status: Mapping[str, Any]) -> tuple[Health, str]:
    """The job's health state and why, the most urgent first (module docstring)."""
    phase = status.get("phase")
    restarts = restart_counts(status)
    if phase == Phase.RESTARTING.value or (
        phase not in TERMINAL_PHASES
        and _condition_true(status, ConditionType.RESTARTING) is not None
    ):
        return "restarting", _restart_reason(status, restarts)
    if phase != Phase.TRAINING.value:
        return "inactive", ""
    if _stalled(status):
        return "stalled", _stall_reason(status)
    stragglers = straggler_rows(status)
    if stragglers:
        return "straggler", _straggler_reason(stragglers)
    return "healthy", ""


def job_live(status: Mapping[str, Any] | None) -> JobLive:
    """The live columns of a job's row, from its status (a plain mapping, camelCase keys)."""
    status = _mapping(status)
    progress = _mapping(status.get("progress"))
    health, reason = job_health(status)
    return JobLive(
        health=health,
        health_reason=reason,
        **{name: read(progress.get(key)) for name, key, read in _PROGRESS_COLUMNS},
        restarts=restart_counts(status),
        stragglers=straggler_rows(status),
    )

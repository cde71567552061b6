"""Names of the TrainingJob status that the CRD schema, the state machine and the UI share."""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    """Where a job is; the CRD's status.phase enum is generated from this list."""

    PENDING = "Pending"
    COMPILING = "Compiling"
    TRAINING = "Training"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})

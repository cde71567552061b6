"""What a pass knows of a training gang's ranks: each rank's newest health-channel message, as
the operator received it (controller.health_server keeps them; a pass reads them from its
snapshot)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# Seconds between writes of a job's status.progress (the operator's --progress-interval).
DEFAULT_INTERVAL_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class RankSample:
    """One rank's newest message, as the operator received it."""

    rank: int
    attempt: int
    world_size: int
    step: int
    step_times_ms: tuple[float, ...]
    received: datetime
    node: str = ""
    samples: int | None = None
    tokens: int | None = None
    # When the rank entered `step`, on the operator's clock: the message's age of the step
    # subtracted from its arrival, or (a rank that sends no age) when the operator first heard
    # of this step. None: unknown (read as `received`).
    step_started: datetime | None = None
    stacks_dumped: str = ""  # the newest stack request the rank answered
    profile_capturing: str = ""  # the on-demand capture whose window the rank records now
    profile_captured: str = ""  # the newest on-demand capture the rank completed
    final: bool = False  # its last message: the rank ended
    last_checkpoint_step: int | None = None  # its newest complete checkpoint, where it says

    @property
    def started(self) -> datetime:
        return self.step_started or self.received

"""The in-memory event model shared by the profiler's writer, its reader and the analysis layer.

Every source (host annotations, step markers, samplers, torch.profiler, Neuron runtime
profiles) produces these records; the on-disk format encodes them compactly and the reader
yields them back unchanged. Times are nanoseconds on the rank's monotonic clock; the
profile's clock sync points map them to wall-clock time so ranks line up.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class EventKind(enum.IntEnum):
    """What a record describes. Values are part of the file format: append, never renumber."""

    ANNOTATION = 1  # host range from annotate()/annotation_begin/end; name = user label
    STEP = 2  # one training step; value = step number
    HOST_OP = 3  # host-side operator (e.g. aten::matmul from torch.profiler)
    LAUNCH = 4  # host-side launch of device work (nrt_execute, cudaLaunchKernel); flow_id links it
    KERNEL = 5  # device execution (NeuronCore program, kernel); flow_id links it to its launch
    MEMCPY = 6  # device memory copy / DMA; value = bytes
    COLLECTIVE = 7  # collective communication (all-reduce...); value = bytes
    SYNC = 8  # host waits for device (synchronize, mark_step barrier)
    # sample: value = CPU utilisation in per-mille of one core summed over cores, averaged over
    # the sample's range (the interval it measured; older files have instants, duration 0)
    CPU_UTIL = 9
    MEMORY = 10  # sample: value = process resident memory in bytes
    COUNTER = 11  # generic counter sample: name = counter name


class Precision(enum.IntEnum):
    """Numeric precision of device work, when the source knows it."""

    UNKNOWN = 0
    FP32 = 1
    BF16 = 2
    FP16 = 3
    FP8 = 4
    INT8 = 5
    MIXED = 6


HOST_DEVICE = -1
"""`Event.device` for host-side records."""


@dataclass(frozen=True, slots=True)
class Event:
    """One profiler record. Instant samples have duration_ns == 0; a CPU_UTIL sample spans
    the interval its value is the mean over."""

    kind: EventKind
    name: str
    start_ns: int
    duration_ns: int = 0
    thread_id: int = 0  # host thread id, or device stream / queue id when device >= 0
    device: int = HOST_DEVICE  # -1 host, otherwise NeuronCore (or GPU) index on this node
    # 0 = none; a LAUNCH and its KERNEL share the same non-zero id. Records with the same id
    # are one flow, drawn from the earliest to the later ones (the torch source also links a
    # forward operator to its backward pass this way). Ids are unique within a rank file.
    flow_id: int = 0
    value: int = 0  # kind-specific payload (step number, bytes, per-mille, ...)
    precision: Precision = Precision.UNKNOWN
    # Nesting depth of host ranges on their thread, among records of the same source (host
    # annotations and torch.profiler operators are nested separately).
    depth: int = 0

    @property
    def end_ns(self) -> int:
        return self.start_ns + self.duration_ns

"""Device and operator activity from torch.profiler (Kineto), for the detailed step window.

The window opens with `torch.profiler.profile(...).start()` and closes with `.stop()` on the
training thread; both are Kineto's own (sub-millisecond on CPU runs) and the Python-side
parsing that torch does lazily is never triggered. The raw `_KinetoEvent`s are converted to
our events on the profiler's flusher thread.

What becomes what:

- CPU operators (`aten::*`, autograd nodes) -> HOST_OP on their OS thread;
- `record_function` ranges (user annotations, `Optimizer.step#...`) -> ANNOTATION;
- CUDA/HIP runtime launch calls -> LAUNCH, and the kernels they start -> KERNEL (memcpy /
  memset -> MEMCPY, NCCL kernels -> COLLECTIVE), linked by Kineto's correlation id;
- forward operators and the backward pass they cause -> linked by a flow id, the way Kineto's
  `fwdbwd` flows link them (same sequence number and forward thread).

Kineto reports wall-clock nanoseconds; they are mapped onto this rank's monotonic clock with a
sync point taken when the window closes.

torch is imported only when a window opens. The source is off without a step window (Kineto
keeps every event in memory until it stops) and when the Neuron runtime's own inspection is on
(the Neuron docs say not to combine NEURON_RT_INSPECT_ENABLE with torch.profiler).

On the native Neuron stack with device profiling (`ProfilerConfig.neuron_device`, set by the
operator through `contract/neuron_env.torch_capture_env`) the window is also TorchNeuron's
device capture, as Neuron Explorer's PyTorch guide documents it: activities CPU and
PrivateUse1 (the `neuron` device), `experimental_config=NeuronConfig(modes=[DEVICE, RUNTIME,
CPU_UTIL, HOST_MEMORY], profile_output_dir=<node dir>/neuron)`, `on_trace_ready` Neuron's
exporter (the framework trace beside the runtime's files) and `torch.neuron.synchronize()`
before stopping, so the device's queued work is in the capture. The runtime writes
`<node dir>/neuron/<instance id>_pid_<pid>/<timestamp>/`, which the post-run merge
(`sources/neuron.py`) reads. Without torch_neuronx the window captures what torch alone can.
UNVERIFIED ON HARDWARE: written against the documented API; the tests use a stand-in module.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from trainium_operator.contract import neuron_env
from trainium_operator.profiler.clock import take_sync_point
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind
from trainium_operator.profiler.sources.base import ActivitySource, SourceBatch, SourceContext

log = logging.getLogger("trainium_operator.profiler")

SOURCE_NAME = "torch"

_LAUNCH_NAMES = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cudaLaunchCooperativeKernel",
    "cudaMemcpyAsync",
    "cudaMemsetAsync",
    "cudaMemcpy",
    "cudaGraphLaunch",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipMemcpyAsync",
    "hipMemsetAsync",
)
_SYNC_NAMES = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cudaStreamWaitEvent",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
)
_SKIPPED_PREFIXES = ("ProfilerStep#", "[memory]")


class KinetoEventLike(Protocol):
    """The part of torch.autograd._KinetoEvent the converter reads (fakeable in tests)."""

    def name(self) -> str: ...
    def start_ns(self) -> int: ...
    def duration_ns(self) -> int: ...
    def device_type(self) -> Any: ...
    def device_index(self) -> int: ...
    def device_resource_id(self) -> int: ...
    def start_thread_id(self) -> int: ...
    def fwd_thread_id(self) -> int: ...
    def sequence_nr(self) -> int: ...
    def correlation_id(self) -> int: ...
    def is_user_annotation(self) -> bool: ...
    def is_hidden_event(self) -> bool: ...
    def is_async(self) -> bool: ...


@dataclass
class _Window:
    """One closed profiling window waiting for conversion."""

    events: Sequence[KinetoEventLike]
    wall_to_mono_offset: int  # monotonic = wall + offset


def _device_kind(event: KinetoEventLike) -> str:
    """'cpu' or 'device' (CUDA/HIP/other accelerator activity recorded by Kineto)."""
    kind = str(event.device_type()).rsplit(".", 1)[-1].lower()
    return "cpu" if kind == "cpu" else "device"


def classify(event: KinetoEventLike) -> EventKind | None:
    """Our kind for a Kineto event, or None to drop it."""
    name = event.name()
    if name.startswith(_SKIPPED_PREFIXES):
        return None
    if _device_kind(event) == "device":
        lowered = name.lower()
        if lowered.startswith(("memcpy", "memset")):
            return EventKind.MEMCPY
        if "nccl" in lowered or "rccl" in lowered:
            return EventKind.COLLECTIVE
        return EventKind.KERNEL
    if event.is_user_annotation():
        return EventKind.ANNOTATION
    if name.startswith(_LAUNCH_NAMES):
        return EventKind.LAUNCH
    if name.startswith(_SYNC_NAMES):
        return EventKind.SYNC
    return EventKind.HOST_OP


class FlowIds:
    """Hands out this source's flow ids, unique within the rank file."""

    def __init__(self, first: int = 1) -> None:
        self._next = first

    def new(self) -> int:
        flow = self._next
        self._next += 1
        return flow


def convert_kineto_events(
    events: Iterable[KinetoEventLike], wall_to_mono_offset: int, flows: FlowIds
) -> SourceBatch:
    """Convert one window's Kineto events into our events (pure; runs on the flusher)."""
    kept: list[tuple[KinetoEventLike, EventKind]] = []
    for ev in events:
        if ev.is_hidden_event():
            continue
        kind = classify(ev)
        if kind is not None:
            kept.append((ev, kind))

    flow_of = _link_flows(kept, flows)
    out: list[Event] = []
    track_names: dict[tuple[int, int], str] = {}
    for index, (ev, kind) in enumerate(kept):
        if kind in (EventKind.KERNEL, EventKind.MEMCPY, EventKind.COLLECTIVE):
            device = ev.device_index()
            thread_id = ev.device_resource_id()  # the stream
            track_names.setdefault((thread_id, device), f"stream {thread_id}")
        else:
            device = HOST_DEVICE
            thread_id = ev.device_resource_id() or ev.start_thread_id()
        out.append(
            Event(
                kind=kind,
                name=ev.name(),
                start_ns=ev.start_ns() + wall_to_mono_offset,
                duration_ns=max(ev.duration_ns(), 0),
                thread_id=thread_id,
                device=device,
                flow_id=flow_of.get(index, 0),
            )
        )
    return SourceBatch(events=with_host_depths(out), track_names=track_names)


def _link_flows(
    kept: Sequence[tuple[KinetoEventLike, EventKind]], flows: FlowIds
) -> dict[int, int]:
    """Flow id per kept-event index: launch -> device work, and forward op -> backward op."""
    flow_of: dict[int, int] = {}

    # Launch to run: the runtime call and the device activity share a correlation id.
    launches: dict[int, int] = {}
    for i, (ev, kind) in enumerate(kept):
        if kind == EventKind.LAUNCH and ev.correlation_id():
            launches[ev.correlation_id()] = i
    for i, (ev, kind) in enumerate(kept):
        if kind in (EventKind.KERNEL, EventKind.MEMCPY, EventKind.COLLECTIVE):
            launch = launches.get(ev.correlation_id())
            if launch is not None and launch not in flow_of:
                flow = flows.new()
                flow_of[launch] = flow
                flow_of[i] = flow

    # Forward to backward, as Kineto links them: among forward ops with the same (thread,
    # sequence number) the latest-starting one launched the autograd node; the earliest
    # backward op with that key (the engine's evaluate_function range) is where it runs.
    forward: dict[tuple[int, int], int] = {}
    backward: dict[tuple[int, int], int] = {}
    for i, (ev, kind) in enumerate(kept):
        if kind not in (EventKind.HOST_OP, EventKind.ANNOTATION) or ev.sequence_nr() < 0:
            continue
        if ev.fwd_thread_id() > 0:
            key = (ev.fwd_thread_id(), ev.sequence_nr())
            best = backward.get(key)
            if best is None or ev.start_ns() < kept[best][0].start_ns():
                backward[key] = i
        elif ev.start_thread_id() != 0:
            key = (ev.start_thread_id(), ev.sequence_nr())
            best = forward.get(key)
            if best is None or ev.start_ns() >= kept[best][0].start_ns():
                forward[key] = i
    for key, bwd in backward.items():
        fwd = forward.get(key)
        if fwd is not None and fwd not in flow_of and bwd not in flow_of:
            flow = flows.new()
            flow_of[fwd] = flow
            flow_of[bwd] = flow
    return flow_of


def with_host_depths(events: list[Event]) -> list[Event]:
    """Set `depth` of host ranges from how they nest on their thread."""
    from dataclasses import replace

    order = sorted(range(len(events)), key=lambda i: (events[i].start_ns, -events[i].duration_ns))
    stacks: dict[tuple[int, int], list[int]] = {}
    result = list(events)
    for i in order:
        ev = events[i]
        if ev.device != HOST_DEVICE:
            continue
        stack = stacks.setdefault((ev.thread_id, ev.device), [])
        while stack and stack[-1] <= ev.start_ns:
            stack.pop()
        if stack:
            result[i] = replace(ev, depth=len(stack))
        # Nested ranges end no later than their parent; push the end to test later ones.
        stack.append(ev.end_ns if not stack else min(ev.end_ns, stack[-1]))
    return result


# TorchNeuron's profiling modes the window captures (Neuron Explorer's PyTorch guide):
# instruction-level device traces (which reserve about 5 GB of HBM on Trn2 while on), the
# runtime's system trace, host CPU utilisation and host memory.
NEURON_PROFILE_MODES = ("DEVICE", "RUNTIME", "CPU_UTIL", "HOST_MEMORY")


def neuron_capture_options(output_dir: Path) -> dict[str, Any]:
    """torch.profiler arguments for TorchNeuron's capture into `output_dir`: its
    `NeuronConfig` as `experimental_config` and Neuron's exporter as `on_trace_ready`; empty
    (logged) when torch_neuronx.profiling is not importable."""
    try:
        from torch_neuronx.profiling import (
            NeuronConfig,
            NeuronProfiler,
            ProfileMode,
        )
    except ImportError as error:
        log.warning("Neuron device capture off: torch_neuronx.profiling unavailable (%s)", error)
        return {}
    options: dict[str, Any] = {
        "modes": [getattr(ProfileMode, mode) for mode in NEURON_PROFILE_MODES],
        "profile_output_dir": str(output_dir),
    }
    neff_cache = os.environ.get(neuron_env.NEFF_CACHE_DIR)
    if neff_cache:
        # NEFFs of the cache are copied beside the capture at stop (they open its device traces).
        options["neff_cache_dir"] = neff_cache
    config = NeuronConfig(**options)
    return {"experimental_config": config, "on_trace_ready": NeuronProfiler(config).export_trace}


def synchronize_neuron() -> None:
    """Wait for the Neuron device's queued work (`torch.neuron.synchronize()`, as the guide
    does before export); the generic accelerator call where that is missing."""
    import torch

    neuron = getattr(torch, "neuron", None)
    if neuron is not None and hasattr(neuron, "synchronize"):
        neuron.synchronize()
    elif hasattr(torch, "accelerator") and torch.accelerator.is_available():
        torch.accelerator.synchronize()


class TorchProfilerSource:
    """An ActivitySource on torch.profiler for the detailed step window."""

    name = SOURCE_NAME

    def __init__(self, context: SourceContext) -> None:
        self._context = context
        self._profile: Any = None
        self._pending: list[_Window] = []
        self._lock = threading.Lock()
        self._flows = FlowIds()
        self._neuron_window = False
        self.windows_captured = 0

    def start_window(self) -> None:
        if self._profile is not None:
            return
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        neuron: dict[str, Any] = {}
        if self._context.config.neuron_device:
            neuron = neuron_capture_options(self._context.node_dir / neuron_env.NEURON_SUBDIR)
            if neuron:
                activities.append(ProfilerActivity.PrivateUse1)
        prof = profile(activities=activities, record_shapes=False, with_stack=False, **neuron)
        prof.start()
        self._profile = prof
        self._neuron_window = bool(neuron)

    def stop_window(self) -> None:
        prof = self._profile
        if prof is None:
            return
        self._profile = None
        if self._neuron_window:
            synchronize_neuron()  # the device's queued work belongs to the window
        prof.stop()
        results = prof.profiler.kineto_results if prof.profiler is not None else None
        if results is None:
            return
        sync = take_sync_point()
        window = _Window(events=results.events(), wall_to_mono_offset=-sync.offset_ns)
        with self._lock:
            self._pending.append(window)
        self.windows_captured += 1

    def collect(self, final: bool) -> SourceBatch:
        with self._lock:
            pending, self._pending = self._pending, []
        batch = SourceBatch()
        for window in pending:
            converted = convert_kineto_events(
                window.events, window.wall_to_mono_offset, self._flows
            )
            batch.events.extend(converted.events)
            batch.track_names.update(converted.track_names)
        return batch

    def close(self) -> None:
        if self._profile is not None:  # stop_window was never called (should not happen)
            self.stop_window()


def create(context: SourceContext) -> ActivitySource | None:
    """The torch source, or None when it cannot or should not run (logged once)."""
    if context.config.steps is None:
        log.info("torch.profiler source off: it needs a step window (TRAINIUM_PROFILE_STEPS)")
        return None
    if os.environ.get(neuron_env.INSPECT_ENABLE, "0") == "1":
        log.info("torch.profiler source off: Neuron runtime inspection is on")
        return None
    if importlib.util.find_spec("torch") is None:
        log.info("torch.profiler source off: torch is not installed")
        return None
    return TorchProfilerSource(context)

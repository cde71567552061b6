"""A synthetic multi-node profile for tests and benchmarks (not part of the operator's wheel).

It is written with the real rank-file writer and manifest, so everything downstream (loader,
statistics, export, UI) runs on exactly what a training job produces. The shape follows a
data-parallel trn1 job: per rank a main thread with step markers, data loading, forward,
backward and optimizer annotations around host ops and `nrt_execute` launches; a data-loader
thread; a NeuronCore whose compute queue runs one program per launch (linked by flow ids) and
whose DMA queue does copies and the gradient all-reduce; CPU and memory samples. Each node's
monotonic clock has its own epoch and drift, so ranks only line up through sync points.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.events import Event, EventKind, Precision
from trainium_operator.profiler.format import RankHeader, write_rank_file
from trainium_operator.profiler.manifest import ManifestRank, ProfileManifest, write_manifest
from trainium_operator.profiler.sampler import CPU_NODE, CPU_PROCESS, MEMORY_NODE_USED, MEMORY_RSS

WALL_EPOCH_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z: fixed for reproducibility
MAIN_THREAD = 1
LOADER_THREAD = 2
COMPUTE_QUEUE = 0
DMA_QUEUE = 1

PHASES = ("forward", "backward", "optimizer_step")
KERNEL_NAMES: tuple[tuple[str, Precision], ...] = (
    ("qkv_projection", Precision.BF16),
    ("attention_scores", Precision.BF16),
    ("softmax", Precision.FP32),
    ("attention_context", Precision.BF16),
    ("out_projection", Precision.BF16),
    ("mlp_up", Precision.BF16),
    ("gelu", Precision.BF16),
    ("mlp_down", Precision.BF16),
    ("layer_norm", Precision.FP32),
    ("residual_add", Precision.BF16),
    ("embedding_lookup", Precision.FP32),
    ("cross_entropy", Precision.FP32),
    ("fp8_gemm", Precision.FP8),
    ("adamw_update", Precision.FP32),
    ("grad_scale", Precision.MIXED),
)
KERNEL_MEAN_US = np.array([180, 140, 60, 140, 120, 260, 40, 260, 35, 20, 50, 90, 110, 70, 25])


@dataclass(frozen=True)
class SyntheticSpec:
    nodes: int = 2
    ranks_per_node: int = 32
    steps: int = 12  # step markers for every step
    detailed_steps: tuple[int, int] = (2, 9)  # inclusive window with annotations/device work
    kernels_per_step: int = 64
    step_ms: float = 60.0
    sample_ms: float = 10.0
    seed: int = 7
    job_name: str = "llama-pretrain"
    namespace: str = "ml"
    # The n-th rank from the end takes longer over its steps than its peers (a slow core, a
    # noisy host), so the rank x step heatmap has a straggler to show; None for no straggler.
    straggler_from_end: int | None = 3

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node

    @property
    def straggler(self) -> int | None:
        if self.straggler_from_end is None or self.straggler_from_end > self.world_size:
            return None
        return self.world_size - self.straggler_from_end


@dataclass(frozen=True)
class _NodeClock:
    mono_epoch_ns: int  # monotonic reading at WALL_EPOCH_NS
    drift: float  # monotonic runs (1 + drift) times as fast as the wall clock

    def mono(self, wall_offset_ns: float) -> int:
        return self.mono_epoch_ns + round(wall_offset_ns * (1.0 + self.drift))


def node_name(index: int) -> str:
    return f"ip-10-0-{index}-{17 + index}.ec2.internal"


def _rank_events(
    spec: SyntheticSpec,
    rank: int,
    clock: _NodeClock,
    step_starts: np.ndarray,
    rng: np.random.Generator,
) -> Iterator[Event]:
    """Events of one rank in wall-offset order, stamped on its node's monotonic clock."""
    local = rank % spec.ranks_per_node
    mono = clock.mono
    flow = 0
    first, last = spec.detailed_steps
    names = KERNEL_NAMES
    # Steps are spaced for the slowest rank; the others finish their step a little earlier.
    busy_share = (0.985, 0.998) if rank == spec.straggler else (0.90, 0.96)
    for step in range(spec.steps):
        step_start = float(step_starts[step]) + rng.uniform(0, 200_000)  # per-rank skew
        step_len = float(step_starts[step + 1] - step_starts[step] - 200_000) * rng.uniform(
            *busy_share
        )
        yield Event(
            EventKind.STEP, "step", mono(step_start), round(step_len), MAIN_THREAD, value=step
        )
        if not first <= step <= last:
            continue
        cursor = step_start
        load_len = step_len * rng.uniform(0.05, 0.09)
        yield Event(
            EventKind.ANNOTATION, "data_loading", mono(cursor), round(load_len), MAIN_THREAD
        )
        yield Event(
            EventKind.ANNOTATION,
            "prefetch_batch",
            mono(cursor + load_len),
            round(step_len * 0.5),
            LOADER_THREAD,
        )
        h2d_len = load_len * 0.4
        yield Event(
            EventKind.MEMCPY,
            "host_to_device",
            mono(cursor + load_len * 0.6),
            round(h2d_len),
            DMA_QUEUE,
            local,
            value=8 << 20,
        )
        cursor += load_len
        device_free = cursor
        phase_share = (0.36, 0.48, 0.08)
        kernels_left = spec.kernels_per_step
        for phase_index, phase in enumerate(PHASES):
            phase_len = step_len * phase_share[phase_index]
            count = (
                kernels_left
                if phase_index == len(PHASES) - 1
                else int(spec.kernels_per_step * phase_share[phase_index] / 0.92)
            )
            kernels_left -= count
            yield Event(EventKind.ANNOTATION, phase, mono(cursor), round(phase_len), MAIN_THREAD)
            slot = phase_len / max(count, 1)
            choices = rng.integers(0, len(names), size=count)
            # Device programs fill ~70% of the host's issue slot on average, so the device
            # is mostly busy and the queue occasionally backs up (launch latency grows).
            weights = KERNEL_MEAN_US[choices] / KERNEL_MEAN_US.mean()
            durations = rng.gamma(4.0, 0.7 * slot * weights / 4.0)
            latencies = rng.lognormal(math.log(40_000), 0.35, size=count)
            for i in range(count):
                op_start = cursor + i * slot
                kernel_name, precision = names[int(choices[i])]
                flow += 1
                yield Event(
                    EventKind.HOST_OP,
                    f"aten::{kernel_name}",
                    mono(op_start),
                    round(slot * 0.8),
                    MAIN_THREAD,
                    depth=1,
                )
                launch_start = op_start + slot * 0.3
                yield Event(
                    EventKind.LAUNCH,
                    "nrt_execute",
                    mono(launch_start),
                    round(slot * 0.4),
                    MAIN_THREAD,
                    flow_id=flow,
                    depth=2,
                )
                run_start = max(launch_start + float(latencies[i]), device_free)
                device_free = run_start + float(durations[i])
                yield Event(
                    EventKind.KERNEL,
                    kernel_name,
                    mono(run_start),
                    round(float(durations[i])),
                    COMPUTE_QUEUE,
                    local,
                    flow_id=flow,
                    precision=precision,
                )
            cursor += phase_len
            if phase == "backward":
                # Gradient all-reduce overlaps the end of backward on the DMA/collective queue.
                cc_len = step_len * rng.uniform(0.06, 0.1)
                yield Event(
                    EventKind.COLLECTIVE,
                    "all_reduce_gradients",
                    mono(cursor - cc_len * 0.5),
                    round(cc_len),
                    DMA_QUEUE,
                    local,
                    value=256 << 20,
                    precision=Precision.BF16,
                )
        sync_len = max(step_start + step_len - cursor, 1.0)
        yield Event(EventKind.SYNC, "mark_step", mono(cursor), round(sync_len * 0.9), MAIN_THREAD)
        yield Event(
            EventKind.MEMCPY,
            "device_to_host",
            mono(cursor + sync_len * 0.5),
            round(sync_len * 0.3),
            DMA_QUEUE,
            local,
            value=64 << 10,
        )


def _samples(
    spec: SyntheticSpec,
    clock: _NodeClock,
    end_ns: float,
    rng: np.random.Generator,
    *,
    whole_node: bool,
) -> list[Event]:
    """What the sampler records: the process's CPU and RSS, and on the node's local rank 0
    also the whole host's (the training processes plus ~4 cores of everything else)."""
    period = spec.sample_ms * 1e6
    count = int(end_ns // period)
    cpu = np.clip(rng.normal(1100, 150, size=count), 50, 4000).astype(np.int64)
    memory = (6 << 30) + np.cumsum(rng.integers(-(1 << 20), 2 << 20, size=count))
    host_cpu = spec.ranks_per_node * cpu + rng.normal(4000, 800, size=count).astype(np.int64)
    events: list[Event] = []
    for i in range(count):
        at = clock.mono(i * period)
        events.append(Event(EventKind.CPU_UTIL, CPU_PROCESS, at, value=int(cpu[i])))
        events.append(Event(EventKind.MEMORY, MEMORY_RSS, at, value=int(memory[i])))
        if whole_node:
            events.append(Event(EventKind.CPU_UTIL, CPU_NODE, at, value=int(host_cpu[i])))
            used = spec.ranks_per_node * int(memory[i]) + (12 << 30)
            events.append(Event(EventKind.MEMORY, MEMORY_NODE_USED, at, value=used))
    return events


def write_synthetic_profile(directory: str | Path, spec: SyntheticSpec | None = None) -> Path:
    """Writes the profile and its manifest under `directory`; returns the directory."""
    spec = spec or SyntheticSpec()
    root = Path(directory)
    rng = np.random.default_rng(spec.seed)
    base_step = spec.step_ms * 1e6
    lengths = base_step * rng.lognormal(0.0, 0.08, size=spec.steps)
    lengths[rng.random(spec.steps) < 0.1] *= 1.8  # occasional slow steps (a recompile, a stall)
    step_starts = np.concatenate(([5e6], 5e6 + np.cumsum(lengths)))
    end_ns = float(step_starts[-1]) + 5e6
    clocks = [
        _NodeClock(
            mono_epoch_ns=int(rng.integers(10**12, 10**14)), drift=float(rng.uniform(-2e-5, 2e-5))
        )
        for _ in range(spec.nodes)
    ]
    manifest_ranks = []
    for node in range(spec.nodes):
        clock = clocks[node]
        for local in range(spec.ranks_per_node):
            rank = node * spec.ranks_per_node + local
            rank_rng = np.random.default_rng([spec.seed, rank])
            events = list(_rank_events(spec, rank, clock, step_starts, rank_rng))
            events.extend(_samples(spec, clock, end_ns, rank_rng, whole_node=local == 0))
            events.sort(key=lambda event: event.start_ns)
            sync = tuple(
                ClockSyncPoint(clock.mono(offset), WALL_EPOCH_NS + int(offset), 500)
                for offset in (0.0, end_ns / 2, end_ns)
            )
            header = RankHeader(
                rank=rank,
                world_size=spec.world_size,
                local_rank=local,
                group_rank=node,
                node=node_name(node),
                hostname=node_name(node),
                pid=1000 + local,
                job_name=spec.job_name,
                namespace=spec.namespace,
                attempt=0,
                step_window=spec.detailed_steps,
                sources=("synthetic",),
                clock_sync=sync,
            )
            relative = Path(node_name(node)) / f"rank-{rank}.trnprof"
            write_rank_file(
                root / relative,
                header,
                events,
                track_names={
                    (MAIN_THREAD, -1): "python main",
                    (LOADER_THREAD, -1): "data loader",
                    (COMPUTE_QUEUE, local): f"NeuronCore {local} compute",
                    (DMA_QUEUE, local): f"NeuronCore {local} DMA / collectives",
                },
            )
            manifest_ranks.append(ManifestRank(rank, node_name(node), local, relative.as_posix()))
    write_manifest(
        root,
        ProfileManifest(
            job_name=spec.job_name,
            namespace=spec.namespace,
            uid="5f1c2d9e-0000-4000-8000-000000000001",
            created="2026-01-01T00:00:00Z",
            world_size=spec.world_size,
            nodes=tuple(node_name(n) for n in range(spec.nodes)),
            ranks=tuple(manifest_ranks),
            step_window=spec.detailed_steps,
            clock_sync=(ClockSyncPoint(clocks[0].mono(0.0), WALL_EPOCH_NS, 500),),
            finished=True,
        ),
    )
    return root


def expected_event_count(spec: SyntheticSpec) -> int:
    """Events the generator writes per spec, less the CPU and memory samples (for sizing)."""
    first, last = spec.detailed_steps
    detailed = last - first + 1
    per_detailed_step = 3 + 1 + len(PHASES) + 3 * spec.kernels_per_step + 1 + 1 + 1
    per_rank = spec.steps + detailed * per_detailed_step
    return spec.world_size * per_rank

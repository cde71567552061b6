"""Profiler benchmark, all in one process: run `python tests/bench/bench_profiler.py`.

Prints
1. the cost of one annotate pair: nothing, ours (off, on, begin/end), and
   torch.profiler.record_function (without and under an active torch profiler);
2. training-step overhead of our profiler on vs off on a small CPU training loop: accounted
   from its parts (records written x cost per record + its threads' CPU time), and measured
   as interleaved off/on blocks with a confidence interval;
3. bytes per event and total bytes for one captured window in our format vs Kineto's Chrome
   JSON (torch.profiler export_chrome_trace), raw and gzip-compressed;
then every target beside its measured figure: accounted overhead <= 0.5 % of a step, the A/B
CPU overhead's 95 % CI upper bound <= 1 % over >= 80 pairs, <= 4 bytes per event on disk
(<= 16 before compression, >= 10x smaller than Kineto's JSON), annotate pair off <= 0.2 us.

Options: --quick for a shorter run (smoke test), --json PATH to also write the figures.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from trainium_operator import profiler
from trainium_operator.profiler.config import ProfilerConfig, StepWindow
from trainium_operator.profiler.format import (
    RankHeader,
    _Tables,
    encode_events_payload,
    read_rank_file,
    write_rank_file,
)
from trainium_operator.profiler.sources.torch_source import FlowIds, convert_kineto_events


def best_ns_per_iteration(body: Callable[[int], None], iterations: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        began = time.perf_counter_ns()
        body(iterations)
        best = min(best, (time.perf_counter_ns() - began) / iterations)
    return best


def loop_nothing(n: int) -> None:
    for _ in range(n):
        pass


def loop_annotate(n: int) -> None:
    annotate = profiler.annotate
    for _ in range(n):
        with annotate("bench"):
            pass


def loop_begin_end(n: int) -> None:
    begin, end = profiler.annotation_begin, profiler.annotation_end
    for _ in range(n):
        end(begin("bench"))


def loop_record_function(n: int) -> None:
    for _ in range(n):
        with record_function("bench"):
            pass


def bench_config(output_dir: Path) -> ProfilerConfig:
    # Host capture as in a training pod outside the torch window: annotations, steps,
    # CPU/memory sampling, background flushing. Device sources are measured in part 3.
    return ProfilerConfig(output_dir=output_dir, node="bench", sources=frozenset())


def recording_config(output_dir: Path, ring_events: int) -> ProfilerConfig:
    # No sampler, and a flusher that sleeps through the measurement (the ring holds every
    # record): what is timed is the cost on the calling thread; the background cost is the stop.
    return ProfilerConfig(
        output_dir=output_dir,
        node="bench",
        sources=frozenset(),
        sample_interval_s=0.0,
        flush_interval_s=3600.0,
        ring_events=ring_events,
    )


def flush_cost_per_event(workdir: Path, events: int = 100_000) -> float:
    """Background cost of one record: a second's worth of a busy rank, flushed at stop.

    100k records is what a rank produces per second inside a torch.profiler window; the
    flusher drains about once a second, so this is the batch size it sees in practice.
    """
    best = float("inf")
    for attempt in range(3):
        profiler.start_profiling(recording_config(workdir / f"flush-{attempt}", 1 << 17))
        loop_annotate(events)
        gc.collect()
        began = time.perf_counter_ns()
        profiler.stop_profiling(wait=True, timeout=600)
        best = min(best, (time.perf_counter_ns() - began) / events)
    return best


def annotate_costs(workdir: Path, iterations: int) -> dict[str, float]:
    results: dict[str, float] = {}
    results["nothing (empty loop)"] = best_ns_per_iteration(loop_nothing, iterations)
    results["ours, profiling off"] = best_ns_per_iteration(loop_annotate, iterations)
    profiler.start_profiling(recording_config(workdir / "annotate", 1 << 23))
    results["ours, recording (calling thread)"] = best_ns_per_iteration(
        loop_annotate, iterations, repeats=3
    )
    results["ours begin/end, recording (calling thread)"] = best_ns_per_iteration(
        loop_begin_end, iterations, repeats=3
    )
    profiler.stop_profiling(wait=True, timeout=600)
    header = read_rank_file(workdir / "annotate" / "bench" / "rank-0.trnprof").header
    assert header.dropped_events == 0, header
    results["ours, background flush per event (drain+encode+zlib+write)"] = flush_cost_per_event(
        workdir
    )
    results["torch record_function, no profiler"] = best_ns_per_iteration(
        loop_record_function, iterations // 2
    )
    with profile(activities=[ProfilerActivity.CPU]):
        results["torch record_function, active profiler"] = best_ns_per_iteration(
            loop_record_function, iterations // 4, repeats=3
        )
    return results


class TinyModel(torch.nn.Module):
    """A small transformer block plus head: enough distinct operators for a realistic trace."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(512, 64)
        self.block = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(64, 512)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.block(self.embed(tokens)))
        return logits


class TrainingLoop:
    """A CPU training step annotated the way the training script annotates its steps."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = TinyModel()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        self.batches = [torch.randint(0, 512, (8, 32)) for _ in range(16)]
        self.step_number = 0
        self.marker_ns: list[int] = []  # duration of each profiler.step() call
        self.main_cpu_ns_per_step = 0.0  # of the last timed block: this thread only

    def step(self) -> None:
        n = self.step_number
        self.step_number += 1
        marker_began = time.perf_counter_ns()
        profiler.step(n)
        self.marker_ns.append(time.perf_counter_ns() - marker_began)
        with profiler.annotate("step"):
            with profiler.annotate("data"):
                tokens = self.batches[n % len(self.batches)]
            with profiler.annotate("forward"):
                logits = self.model(tokens)
                loss = torch.nn.functional.cross_entropy(logits.view(-1, 512), tokens.view(-1))
            with profiler.annotate("backward"):
                loss.backward()  # type: ignore[no-untyped-call]
            with profiler.annotate("optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)

    def timed_block(self, seconds: float) -> tuple[list[float], float]:
        """Wall ns of each step, and process CPU ns per step (all threads, ours included)."""
        times: list[float] = []
        cpu_began = time.process_time_ns()
        main_began = time.thread_time_ns()
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            began = time.perf_counter_ns()
            self.step()
            times.append(time.perf_counter_ns() - began)
        self.main_cpu_ns_per_step = (time.thread_time_ns() - main_began) / len(times)
        return times, (time.process_time_ns() - cpu_began) / len(times)


def median_ci(values: list[float]) -> tuple[float, float]:
    """95% bootstrap confidence interval of the median (a fixed seed: reproducible)."""
    rng = random.Random(1)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(2000))
    return medians[50], medians[1949]


def step_overhead(
    workdir: Path,
    pairs: int,
    block_s: float,
    lead_s: float,
    calling_thread_ns_per_record: float,
) -> dict[str, Any]:
    """Profiler on vs off on the training loop, two ways.

    Accounted: what the profiler adds per step, from its parts: every record it wrote (from
    the files) times what one record costs the calling thread (part 1), plus the CPU its own
    threads use once running (flushing those records, sampling; read from their thread
    clocks over a steady 8 s run). Robust on a noisy machine.

    A/B: interleaved off/on blocks, the median over pairs of (on / off - 1), in process CPU
    per step (includes our threads) and in wall time, with a bootstrap confidence interval.
    Each "on" block is a steady stretch of a profiling session: the session starts `lead_s`
    before the block (its threads start and write the file's header and the manifest) and
    stops after it, waiting for the file, so the block holds the per-second work of a long
    run (with the default 1 s flush and 200 ms sampling, a 1 s block from 0.25 s in holds one
    flush and five samples) and not the once-per-run start and stop, measured on their own.
    On a quiet machine this confirms the accounted figure; on a shared one its interval shows
    how much the neighbours move the measurement.
    """
    loop = TrainingLoop()
    loop.timed_block(2.0)  # warm up allocator, caches and the thread pool
    wall: dict[str, list[float]] = {"off": [], "on": []}
    cpu_off: list[float] = []
    main_cpu_off: list[float] = []
    wall_ratios: list[float] = []
    cpu_ratios: list[float] = []
    session_steps = 0
    for pair in range(pairs):
        order = ("off", "on") if pair % 2 == 0 else ("on", "off")
        wall_median: dict[str, float] = {}
        cpu_per_step: dict[str, float] = {}
        for side in order:
            if side == "on":
                first_step = loop.step_number
                profiler.start_profiling(bench_config(workdir / f"steps-{pair}"))
                loop.timed_block(lead_s)
            times, cpu = loop.timed_block(block_s)
            if side == "on":
                assert profiler.stop_profiling(wait=True, timeout=60)
                session_steps += loop.step_number - first_step
            else:
                cpu_off.append(cpu)
                main_cpu_off.append(loop.main_cpu_ns_per_step)
            wall[side].extend(times)
            wall_median[side] = statistics.median(times)
            cpu_per_step[side] = cpu
        wall_ratios.append(wall_median["on"] / wall_median["off"] - 1)
        cpu_ratios.append(cpu_per_step["on"] / cpu_per_step["off"] - 1)
    background_rate = steady_background_cpu(loop, workdir)
    headers = [
        read_rank_file(workdir / f"steps-{p}" / "bench" / "rank-0.trnprof").header
        for p in range(pairs)
    ]
    records = sum(h.event_count for h in headers)
    step_cpu_ns = statistics.median(cpu_off)
    steps_per_s = 1e9 / statistics.median(wall["on"])
    background_per_step = background_rate / steps_per_s
    accounted_ns = records * calling_thread_ns_per_record / session_steps + background_per_step
    cpu_low, cpu_high = median_ci(cpu_ratios)
    wall_low, wall_high = median_ci(wall_ratios)
    return {
        "pairs": pairs,
        "steps_off": len(wall["off"]),
        "steps_on": len(wall["on"]),
        "median_step_ms_off": statistics.median(wall["off"]) / 1e6,
        "median_step_ms_on": statistics.median(wall["on"]) / 1e6,
        "median_step_cpu_ms_off": step_cpu_ns / 1e6,
        "median_step_main_thread_cpu_ms_off": statistics.median(main_cpu_off) / 1e6,
        "records_per_step": records / session_steps,
        "background_thread_us_per_step": background_per_step / 1e3,
        "background_thread_cpu_pct_of_core": 100 * background_rate / 1e9,
        "accounted_us_per_step": accounted_ns / 1e3,
        "accounted_overhead_pct": 100 * accounted_ns / step_cpu_ns,
        "cpu_overhead_pct": 100 * statistics.median(cpu_ratios),
        "cpu_overhead_ci_pct": (100 * cpu_low, 100 * cpu_high),
        "wall_overhead_pct": 100 * statistics.median(wall_ratios),
        "wall_overhead_ci_pct": (100 * wall_low, 100 * wall_high),
        "dropped_events": sum(h.dropped_events for h in headers),
        "session_start_stop_cpu_ms": session_cost_ms(workdir),
        "cpu_ratios_per_pair": cpu_ratios,
        "wall_ratios_per_pair": wall_ratios,
    }


def session_cost_ms(workdir: Path, sessions: int = 7) -> float:
    """Process CPU of starting a profiling session and stopping it with its file written
    (threads, file header, manifest at start and end): once per run, median."""
    costs = []
    for i in range(sessions):
        began = time.process_time_ns()
        profiler.start_profiling(bench_config(workdir / f"session-{i}"))
        time.sleep(0.05)
        assert profiler.stop_profiling(wait=True, timeout=60)
        costs.append((time.process_time_ns() - began) / 1e6)
    return statistics.median(costs)


def steady_background_cpu(loop: TrainingLoop, workdir: Path, seconds: float = 8.0) -> float:
    """CPU ns per second used by the profiler's threads once running (start-up excluded)."""
    profiler.start_profiling(bench_config(workdir / "steady"))
    loop.timed_block(1.0)
    first = profiler.background_cpu_ns() or 0
    began = time.perf_counter_ns()
    loop.timed_block(seconds)
    used = (profiler.background_cpu_ns() or 0) - first
    elapsed = time.perf_counter_ns() - began
    profiler.stop_profiling(wait=True, timeout=60)
    return used * 1e9 / elapsed


def torch_window_costs(workdir: Path, before: int, window: int, after: int) -> dict[str, float]:
    """The torch.profiler source in use: what opening/closing the window costs the step() call,
    and how much slower steps are while Kineto records every operator."""
    loop = TrainingLoop()
    loop.timed_block(1.0)
    first, last = before, before + window - 1
    config = ProfilerConfig(
        output_dir=workdir / "window",
        node="bench",
        steps=StepWindow(first, last),
        sources=frozenset({"torch"}),
    )
    loop.step_number = 0
    loop.marker_ns = []
    profiler.start_profiling(config)
    times: list[int] = []
    for _ in range(before + window + after):
        began = time.perf_counter_ns()
        loop.step()
        times.append(time.perf_counter_ns() - began)
    profiler.stop_profiling(wait=True, timeout=120)
    inside = times[first + 1 : last]  # excludes the steps that open and close the window
    outside = times[1:first] + times[last + 2 :]
    markers = loop.marker_ns
    plain_markers = markers[1:first] + markers[last + 2 :]
    events = read_rank_file(workdir / "window" / "bench" / "rank-0.trnprof").events
    return {
        "open_window_ms": markers[first] / 1e6,
        "close_window_ms": markers[last + 1] / 1e6,
        "plain_step_marker_us": statistics.median(plain_markers) / 1e3,
        "step_ms_outside_window": statistics.median(outside) / 1e6,
        "step_ms_inside_window": statistics.median(inside) / 1e6,
        "torch_events_per_step": sum(1 for e in events if e.kind.name == "HOST_OP") / window,
    }


def trace_sizes(workdir: Path, steps: int) -> dict[str, Any]:
    """One captured window, written both ways from the same Kineto events."""
    loop = TrainingLoop()
    loop.timed_block(1.0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            with record_function("train_step"):
                loop.step()
    json_path = workdir / "kineto.json"
    prof.export_chrome_trace(str(json_path))
    kineto_events = prof.profiler.kineto_results.events()
    json_bytes = json_path.read_bytes()
    json_gz = gzip.compress(json_bytes, compresslevel=6)
    trace_events = json.loads(json_bytes)["traceEvents"]

    ours = convert_kineto_events(kineto_events, wall_to_mono_offset=0, flows=FlowIds()).events
    header = RankHeader(rank=0, node="bench", sources=("torch",))
    ours_path = workdir / "rank-0.trnprof"
    ours_size = write_rank_file(ours_path, header, ours)
    encoded = len(encode_events_payload(_Tables(), ours))
    assert read_rank_file(ours_path).events == ours  # the compact file loses nothing we keep

    def per_event(size: int, count: int) -> float:
        return size / count if count else float("nan")

    return {
        "window_steps": steps,
        "kineto_json_events": len(trace_events),
        "kineto_json_bytes": len(json_bytes),
        "kineto_json_gz_bytes": len(json_gz),
        "ours_events": len(ours),
        "ours_encoded_bytes_before_compression": encoded,
        "ours_file_bytes": ours_size,
        "kineto_json_bytes_per_event": per_event(len(json_bytes), len(trace_events)),
        "kineto_json_gz_bytes_per_event": per_event(len(json_gz), len(trace_events)),
        "ours_bytes_per_event_before_compression": per_event(encoded, len(ours)),
        "ours_file_bytes_per_event": per_event(ours_size, len(ours)),
        "ratio_json_to_ours": len(json_bytes) / ours_size,
        "ratio_json_gz_to_ours": len(json_gz) / ours_size,
    }


def print_table(title: str, rows: list[tuple[str, str]]) -> None:
    print(f"\n{title}")
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"  {label:<{width}}  {value}")


def print_targets(
    costs: dict[str, float], overhead: dict[str, Any], sizes: dict[str, Any]
) -> list[dict[str, Any]]:
    """The targets against this run's figures: measured / target, and met or missed."""
    off_us = costs["ours, profiling off"] / 1e3
    on_us = costs["ours, recording (calling thread)"] / 1e3
    torch_us = costs["torch record_function, active profiler"] / 1e3
    flush_us = costs["ours, background flush per event (drain+encode+zlib+write)"] / 1e3
    rows = [
        ("accounted step overhead", overhead["accounted_overhead_pct"], 0.5, "%", "<="),
        (
            f"A/B process CPU per step, 95% CI upper bound ({overhead['pairs']} pairs)",
            overhead["cpu_overhead_ci_pct"][1],
            1.0,
            "%",
            "<=",
        ),
        ("A/B interleaved pairs", overhead["pairs"], 80, "", ">="),
        ("bytes per event, rank file", sizes["ours_file_bytes_per_event"], 4.0, "B", "<="),
        (
            "bytes per event before compression",
            sizes["ours_bytes_per_event_before_compression"],
            16.0,
            "B",
            "<=",
        ),
        ("Kineto JSON / ours", sizes["ratio_json_to_ours"], 10.0, "x", ">="),
        ("annotate pair, profiling off", off_us, 0.2, "us", "<="),
    ]
    print("\nTargets (this run)")
    print(f"  {'what':<66} {'measured':>11} {'target':>11} {'ratio':>7}")
    results = []
    for what, measured, target, unit, sense in rows:
        met = measured <= target if sense == "<=" else measured >= target
        print(
            f"  {what:<66} {measured:>8.3f} {unit:<2} {sense}{target:>6g} {unit:<2}"
            f" {measured / target:>6.2f}x  {'met' if met else 'MISSED'}"
        )
        results.append({"what": what, "measured": measured, "target": target, "met": met})
    print(
        f"  annotate pair, recording (calling thread): {on_us:.3f} us; off: {off_us:.3f} us;"
        f" background flush per record: {flush_us:.3f} us"
    )
    print(
        f"  peer: torch record_function under an active profiler {torch_us:.3f} us ="
        f" {torch_us / (on_us + flush_us):.1f}x ours all-in (calling thread + background)"
    )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (smoke test)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier timings on a shared machine
    iterations = 50_000 if args.quick else 400_000
    # 160 pairs (the target asks for at least 80): on the shared 2-core VM one pair's ratio
    # varies by a few percent, and the interval of the median narrows with the square root.
    pairs = 4 if args.quick else 160
    block_s, lead_s = 1.0, 0.25
    window_steps = 5 if args.quick else 20

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cpus {os.cpu_count()}")
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-profiler-") as tmp:
        workdir = Path(tmp)
        costs = annotate_costs(workdir, iterations)
        figures["annotate_pair_ns"] = costs
        nothing = costs["nothing (empty loop)"]
        print_table(
            "1. Cost of one annotate pair (enter + exit), best of repeats",
            [(k, f"{v:8.1f} ns = {v / 1e3:6.3f} us") for k, v in costs.items()],
        )
        ours_total = (
            costs["ours, recording (calling thread)"]
            + costs["ours, background flush per event (drain+encode+zlib+write)"]
        )
        torch_active = costs["torch record_function, active profiler"]
        print(
            f"  ours all-in (calling thread + background): {ours_total:.0f} ns;"
            f" torch(active) / ours all-in: {torch_active / ours_total:.1f}x"
        )

        overhead = step_overhead(
            workdir, pairs, block_s, lead_s, costs["ours, recording (calling thread)"] - nothing
        )
        figures["step_overhead"] = overhead
        cpu_low, cpu_high = overhead["cpu_overhead_ci_pct"]
        wall_low, wall_high = overhead["wall_overhead_ci_pct"]
        print_table(
            f"2. Training-step overhead, profiler on vs off ({pairs} interleaved off/on pairs "
            f"of {block_s:g} s blocks, each 'on' block {lead_s:g} s into its session)",
            [
                ("steps measured off / on", f"{overhead['steps_off']} / {overhead['steps_on']}"),
                (
                    "median step off / on (wall)",
                    f"{overhead['median_step_ms_off']:.3f} / "
                    f"{overhead['median_step_ms_on']:.3f} ms",
                ),
                (
                    "median step CPU off: process / training thread",
                    f"{overhead['median_step_cpu_ms_off']:.3f} / "
                    f"{overhead['median_step_main_thread_cpu_ms_off']:.3f} ms (other threads"
                    " of the process working would dilute the A/B ratios)",
                ),
                (
                    "records per step (annotations, marker, samples)",
                    f"{overhead['records_per_step']:.2f}",
                ),
                (
                    "profiler threads' CPU, steady state",
                    f"{overhead['background_thread_us_per_step']:.2f} us per step "
                    f"({overhead['background_thread_cpu_pct_of_core']:.3f} % of a core)",
                ),
                (
                    "ACCOUNTED overhead per step",
                    f"{overhead['accounted_us_per_step']:.2f} us = "
                    f"{overhead['accounted_overhead_pct']:.3f} % of a step",
                ),
                (
                    "A/B overhead, process CPU per step",
                    f"{overhead['cpu_overhead_pct']:+.2f} %  "
                    f"(95% CI {cpu_low:+.2f} .. {cpu_high:+.2f} %)",
                ),
                (
                    "A/B overhead, wall time per step",
                    f"{overhead['wall_overhead_pct']:+.2f} %  "
                    f"(95% CI {wall_low:+.2f} .. {wall_high:+.2f} %)",
                ),
                ("dropped events", str(overhead["dropped_events"])),
                (
                    "a session's start + stop, once per run (not in the blocks)",
                    f"{overhead['session_start_stop_cpu_ms']:.1f} ms CPU",
                ),
            ],
        )

        window = torch_window_costs(workdir, before=5, window=window_steps, after=5)
        figures["torch_window"] = window
        print_table(
            f"2b. With the torch.profiler source ({window_steps}-step window; informational)",
            [
                ("step() that opens the window", f"{window['open_window_ms']:.2f} ms"),
                ("step() that closes the window", f"{window['close_window_ms']:.2f} ms"),
                ("step() elsewhere", f"{window['plain_step_marker_us']:.1f} us"),
                (
                    "median step outside / inside the window",
                    f"{window['step_ms_outside_window']:.3f} / "
                    f"{window['step_ms_inside_window']:.3f} ms "
                    f"({window['torch_events_per_step']:.0f} operator events per step)",
                ),
            ],
        )

        sizes = trace_sizes(workdir, window_steps)
        figures["trace_size"] = sizes
        print_table(
            f"3. Trace size for the same {window_steps}-step window (torch.profiler CPU ops)",
            [
                (
                    "Kineto Chrome JSON",
                    f"{sizes['kineto_json_bytes']:>10,} B  {sizes['kineto_json_events']:>7,} events"
                    f"  {sizes['kineto_json_bytes_per_event']:6.1f} B/event",
                ),
                (
                    "Kineto Chrome JSON, gzip -6",
                    f"{sizes['kineto_json_gz_bytes']:>10,} B  "
                    f"{sizes['kineto_json_events']:>7,} events"
                    f"  {sizes['kineto_json_gz_bytes_per_event']:6.1f} B/event",
                ),
                (
                    "ours, encoded (before compression)",
                    f"{sizes['ours_encoded_bytes_before_compression']:>10,} B  "
                    f"{sizes['ours_events']:>7,} events"
                    f"  {sizes['ours_bytes_per_event_before_compression']:6.1f} B/event",
                ),
                (
                    "ours, rank file",
                    f"{sizes['ours_file_bytes']:>10,} B  {sizes['ours_events']:>7,} events"
                    f"  {sizes['ours_file_bytes_per_event']:6.1f} B/event",
                ),
                ("ratio JSON / ours", f"{sizes['ratio_json_to_ours']:.1f}x"),
                ("ratio JSON.gz / ours", f"{sizes['ratio_json_gz_to_ours']:.1f}x"),
            ],
        )
        print(
            "  (Kineto counts flow arrows and metadata as events of their own; ours folds flows"
            " into the linked records' flow_id.)"
        )
        figures["targets"] = print_targets(costs, overhead, sizes)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

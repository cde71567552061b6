"""The profile's dashboard as plain data (for the web UI's JSON) and as a text report."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainium_operator.analysis.columns import F64, EventColumns, kind_mask
from trainium_operator.analysis.loading import LoadedProfile, RankInfo, profile_warnings
from trainium_operator.analysis.stats import (
    ActivityBreakdown,
    DurationStats,
    Histogram,
    LatencyPairs,
    activity_breakdown,
    annotation_histogram,
    annotation_table,
    cpu_activity,
    latency_of_pairs,
    latency_pairs,
    ordered_operations,
    precision_breakdown,
    rank_step_matrix,
    step_summary,
    stragglers,
    top_operations,
    transfer_breakdown,
    utilisation_over_time,
)
from trainium_operator.profiler.events import EventKind
from trainium_operator.profiler.manifest import ProfileManifest


def _stats(stats: DurationStats) -> dict[str, Any]:
    return dataclasses.asdict(stats)


def _histogram(histogram: Histogram) -> dict[str, Any]:
    return {"edges": histogram.edges.tolist(), "counts": histogram.counts.tolist()}


def _finite(values: F64) -> list[float | None]:
    return [None if math.isnan(v) else round(float(v), 4) for v in values.tolist()]


@dataclass(frozen=True)
class DashboardInputs:
    """What the dashboard is computed from. For a loaded profile every column set is its whole
    columns (`inputs_of`); the UI composes them from per-rank summaries instead
    (`analysis.summary`), whose reductions give the same numbers without the whole profile."""

    path: Path
    manifest: ProfileManifest
    manifest_problem: str | None
    nodes: tuple[str, ...]
    ranks: tuple[RankInfo, ...]
    origin_wall_ns: int
    end_ns: int
    events: int
    load_seconds: float
    samples: EventColumns  # step markers, CPU samples and annotations (other events may be in)
    operations: EventColumns  # kernels, host ops, memory operations, collectives (ditto)
    busy: EventColumns  # device-busy intervals (or their unions per device) and CPU samples
    activity: ActivityBreakdown
    latency: LatencyPairs
    device_events: int  # events of the device kinds on a device


def device_event_count(columns: EventColumns) -> int:
    return int(np.count_nonzero(kind_mask(columns.kind, DEVICE_KINDS) & (columns.device >= 0)))


def inputs_of(profile: LoadedProfile) -> DashboardInputs:
    columns = profile.columns
    return DashboardInputs(
        path=profile.path,
        manifest=profile.manifest,
        manifest_problem=profile.manifest_problem,
        nodes=profile.nodes,
        ranks=profile.ranks,
        origin_wall_ns=profile.origin_wall_ns,
        end_ns=profile.end_ns,
        events=len(columns),
        load_seconds=profile.load_seconds,
        samples=columns,
        operations=columns,
        busy=columns,
        activity=activity_breakdown(columns),
        latency=latency_pairs(columns),
        device_events=device_event_count(columns),
    )


def profile_overview(inputs: DashboardInputs) -> dict[str, Any]:
    manifest = inputs.manifest
    return {
        "path": str(inputs.path),
        "job_name": manifest.job_name,
        "namespace": manifest.namespace,
        "uid": manifest.uid,
        "attempt": manifest.attempt,
        "created": manifest.created,
        "step_window": list(manifest.step_window) if manifest.step_window else None,
        "nodes": list(inputs.nodes),
        "ranks": len(inputs.ranks),
        "events": inputs.events,
        "duration_ns": inputs.end_ns,
        "origin_wall_ns": inputs.origin_wall_ns,
        "dropped_events": sum(rank.dropped_events for rank in inputs.ranks),
        "load_seconds": round(inputs.load_seconds, 3),
        "warnings": profile_warnings(inputs.manifest_problem, inputs.ranks),
    }


def _operations(columns: EventColumns, kind: EventKind, listed: int) -> dict[str, Any]:
    by_time = top_operations(columns, kind=kind)
    by_count = ordered_operations(by_time, "count")
    return {
        "distinct": len(by_time),
        "count": sum(row.count for row in by_time),
        "total_ns": sum(row.total_ns for row in by_time),
        "by_time": [dataclasses.asdict(row) for row in by_time[:listed]],
        "by_count": [dataclasses.asdict(row) for row in by_count[:listed]],
    }


DEVICE_KINDS = (EventKind.KERNEL, EventKind.MEMCPY, EventKind.COLLECTIVE, EventKind.SYNC)


def _why_no_accelerator(sources: set[str]) -> str:
    """Why a profile holds no device activity, from the capture sources its ranks ran."""
    listed = ", ".join(sorted(sources)) or "none"
    if "neuron" in sources:
        return (
            f"the Neuron runtime source ran (sources: {listed}) but no device events were "
            "merged into the rank files: run `python -m trainium_operator.profiler.sources.neuron "
            "<profile dir>` after the job, or check that neuron-profile is in the image"
        )
    if "torch" in sources:
        return (
            f"this was a CPU-only run (sources: {listed}): torch.profiler saw no CUDA device, so "
            "it recorded host operators only, and the Neuron runtime source did not run (not a "
            "Trainium node, or spec.profile.neuronDeviceProfile off)"
        )
    return (
        f"no device source ran (sources: {listed}): neither torch.profiler (it needs a step "
        "window, TRAINIUM_PROFILE_STEPS) nor the Neuron runtime source; only host annotations, "
        "step markers and CPU samples were recorded"
    )


def neuron_capture_summary(ranks: tuple[RankInfo, ...]) -> dict[str, Any]:
    """What the Neuron runtime's capture contributed, from the notes the post-run merge left
    in each rank file: system profile always, device profile only where one was converted."""
    merged = [rank for rank in ranks if "neuron_capture_dir" in rank.extra]
    with_device = [
        rank for rank in merged if int(rank.extra.get("neuron_device_profile_events", "0") or 0)
    ]
    raw_only = [
        rank
        for rank in merged
        if rank not in with_device and int(rank.extra.get("neuron_device_profiles", "0") or 0)
    ]
    bases = sorted(
        {
            base
            for rank in with_device
            for base in rank.extra.get("neuron_device_time_base", "").split(",")
            if base and base != "none"
        }
    )
    note = None
    if merged and not with_device:
        note = (
            f"the Neuron system profile was merged for {len(merged)} rank(s) but no device "
            "profile: device profiles come from spec.profile.neuronDeviceProfile (on the "
            "native stack, TorchNeuron's torch.profiler capture of the window), and the "
            ".ntff files are read only through neuron-explorer's Perfetto export "
            "(device_profile_model_<id>.pftrace)"
            + (
                f"; {len(raw_only)} rank(s) have .ntff files that were not exported"
                if raw_only
                else ""
            )
        )
    elif "anchored" in bases:
        note = (
            "device-profile timestamps were device-relative: they were placed at each rank's "
            "first NeuronCore execution, so their offset from host events is approximate"
        )
    return {
        "system_profile_ranks": len(merged),
        "device_profile_ranks": len(with_device),
        "device_time_bases": bases,
        "note": note,
    }


def accelerator_summary(inputs: DashboardInputs) -> dict[str, Any]:
    """Whether any accelerator activity was recorded, and if not, why, so the dashboard and
    the report say so instead of showing zeros."""
    sources = {source for rank in inputs.ranks for source in rank.sources}
    recorded = inputs.device_events > 0
    window = inputs.manifest.step_window
    return {
        "recorded": recorded,
        "device_events": inputs.device_events,
        "sources": sorted(sources),
        "reason": None if recorded else _why_no_accelerator(sources),
        "window": list(window) if window else None,
        "host_ops_shown": not recorded,
        "neuron": neuron_capture_summary(inputs.ranks),
    }


def _matrix(values: F64, digits: int) -> list[list[float | None]]:
    return [
        [None if math.isnan(v) else round(float(v), digits) for v in row.tolist()] for row in values
    ]


def dashboard(profile: LoadedProfile, buckets: int = 240, top: int = 50) -> dict[str, Any]:
    """Everything the dashboard page draws, computed once per loaded profile; the kernel and
    host-op lists hold the `top` first by time and by count."""
    return dashboard_of(inputs_of(profile), buckets, top)


def dashboard_of(inputs: DashboardInputs, buckets: int = 240, top: int = 50) -> dict[str, Any]:
    """The dashboard (see `dashboard`) from its inputs."""
    samples, operations = inputs.samples, inputs.operations
    node_count = len(inputs.nodes)
    utilisation = utilisation_over_time(inputs.busy, node_count, 0, max(inputs.end_ns, 1), buckets)
    steps = step_summary(samples)
    heatmap = rank_step_matrix(samples)
    latency = latency_of_pairs(inputs.latency)
    activity = inputs.activity
    cpu = cpu_activity(samples, node_count)
    process_cores, host_cores = cpu.mean_cores()
    device_active = activity.device_active_ns()
    device_idle = activity.device_idle_ns()
    return {
        "overview": profile_overview(inputs),
        "accelerator": accelerator_summary(inputs),
        "utilisation": {
            "bucket_start_ns": utilisation.bucket_start_ns.tolist(),
            "bucket_ns": utilisation.bucket_ns,
            "node_busy": [_finite(row) for row in utilisation.node_busy],
            "node_cpu_cores": [_finite(row) for row in utilisation.node_cpu_cores],
            "devices": [{"node": node, "device": device} for node, device in utilisation.devices],
            "device_busy": _matrix(utilisation.device_busy, 3),
            "device_mean_busy": [round(float(row.mean()), 4) for row in utilisation.device_busy],
        },
        "device_time": {
            "active_ns": device_active,
            "idle_ns": device_idle,
            "active_share": device_active / max(device_active + device_idle, 1),
        },
        "cpu": [
            {
                "node": node,
                "process_active_ns": int(cpu.process_active_ns[i]),
                "host_active_ns": int(cpu.node_active_ns[i]),
                "sampled_ns": int(cpu.sampled_ns[i]),
                "host_sampled_ns": int(cpu.host_sampled_ns[i]),
                "process_mean_cores": round(float(process_cores[i]), 3),
                "host_mean_cores": round(float(host_cores[i]), 3),
            }
            for i, node in enumerate(inputs.nodes)
        ],
        "kernels": _operations(operations, EventKind.KERNEL, top),
        "host_ops": _operations(operations, EventKind.HOST_OP, top),
        "steps": {
            "rows": [dataclasses.asdict(row) for row in steps.rows],
            "stats": _stats(steps.stats),
            "histogram": _histogram(steps.histogram),
            "heatmap": {
                "ranks": heatmap.ranks.tolist(),
                "first_step": heatmap.first_step.tolist(),
                "last_step": heatmap.last_step.tolist(),
                "duration_ns": _matrix(heatmap.duration_ns, 0),
                "relative": _matrix(heatmap.relative, 4),
            },
            "stragglers": [dataclasses.asdict(row) for row in stragglers(samples, heatmap)],
        },
        "precision": [dataclasses.asdict(row) for row in precision_breakdown(operations)],
        "activity": {"totals_ns": activity.totals_ns, "shares": activity.shares()},
        "memory_ops": [dataclasses.asdict(row) for row in transfer_breakdown(operations)],
        "collectives": [
            dataclasses.asdict(row) for row in transfer_breakdown(operations, EventKind.COLLECTIVE)
        ],
        "launch_latency": {
            "stats": _stats(latency.stats),
            "histogram": _histogram(latency.histogram),
            "matched": latency.matched,
            "unmatched_launches": latency.unmatched_launches,
            "unmatched_kernels": latency.unmatched_kernels,
            "slowest": [
                {"rank": rank, "kernel": name, "latency_ns": value}
                for rank, name, value in latency.slowest
            ],
        },
        "annotations": [
            {"name": row.name, "stats": _stats(row.stats)} for row in annotation_table(samples)
        ],
    }


def annotation(profile: LoadedProfile, name: str, bins: int = 40) -> dict[str, Any]:
    return annotation_of(profile.columns, name, bins)


def annotation_of(samples: EventColumns, name: str, bins: int = 40) -> dict[str, Any]:
    """One annotation's statistics and histogram, from columns holding its events."""
    rows = [row for row in annotation_table(samples) if row.name == name]
    return {
        "name": name,
        "stats": _stats(rows[0].stats) if rows else None,
        "histogram": _histogram(annotation_histogram(samples, name, bins)),
    }


# ---------------------------------------------------------------- text


def format_ns(ns: float) -> str:
    if ns >= 1e9:
        return f"{ns / 1e9:.3f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.3f} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.1f} µs"
    return f"{ns:.0f} ns"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    line = "  ".join(
        h.ljust(w) if i == 0 else h.rjust(w)
        for i, (h, w) in enumerate(zip(headers, widths, strict=True))
    )
    out = [line, "-" * len(line)]
    for row in rows:
        out.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    return out


def _ops_table(title: str, ops: dict[str, Any], key: str, top: int) -> list[str]:
    lines = [
        "",
        f"{title} ({ops['distinct']} distinct, {ops['count']:,} runs, "
        f"{format_ns(ops['total_ns'])})",
    ]
    if not ops["distinct"]:
        return [*lines, "  none recorded"]
    return lines + [
        "  " + line
        for line in _table(
            ["name", "count", "total", "mean", "p50", "p99", "share"],
            [
                [
                    k["name"],
                    f"{k['count']:,}",
                    format_ns(k["total_ns"]),
                    format_ns(k["mean_ns"]),
                    format_ns(k["p50_ns"]),
                    format_ns(k["p99_ns"]),
                    f"{100 * k['share']:.1f} %",
                ]
                for k in ops[key][:top]
            ],
        )
    ]


def _transfer_table(title: str, rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return ["", f"{title}: none recorded"]
    return ["", title] + [
        "  " + line
        for line in _table(
            ["name", "count", "time", "share", "bytes", "GB/s"],
            [
                [
                    r["name"],
                    f"{r['count']:,}",
                    format_ns(r["total_ns"]),
                    f"{100 * r['share']:.1f} %",
                    f"{r['bytes']:,}",
                    f"{r['gbytes_per_s']:.2f}",
                ]
                for r in rows
            ],
        )
    ]


def _stats_line(stats: dict[str, Any]) -> str:
    return (
        f"  mean {format_ns(stats['mean_ns'])}  p50 {format_ns(stats['p50_ns'])}  "
        f"p90 {format_ns(stats['p90_ns'])}  p99 {format_ns(stats['p99_ns'])}  "
        f"max {format_ns(stats['max_ns'])}"
    )


def text_report(data: dict[str, Any], top: int = 15) -> str:
    """The dashboard as text: `data` is what `dashboard()` returns."""
    overview = data["overview"]
    lines = [
        f"Profile {overview['path']}",
        f"  job {overview['namespace']}/{overview['job_name']} (uid {overview['uid'] or '-'}, "
        f"attempt {overview['attempt']}), created {overview['created'] or '-'}",
        f"  {len(overview['nodes'])} nodes, {overview['ranks']} ranks, "
        f"{overview['events']:,} events over {format_ns(overview['duration_ns'])}, "
        f"loaded in {overview['load_seconds']:.2f} s",
    ]
    lines += [f"  warning: {warning}" for warning in overview["warnings"]]

    steps = data["steps"]
    stats = steps["stats"]
    lines += ["", f"Steps ({stats['count']} with markers; step time = slowest rank)"]
    if stats["count"]:
        lines.append(_stats_line(stats))
        slowest = sorted(steps["rows"], key=lambda row: -row["max_ns"])[:5]
        lines += [
            "  " + line
            for line in _table(
                ["slowest steps", "time", "mean", "min", "slowest rank"],
                [
                    [
                        str(r["step"]),
                        format_ns(r["max_ns"]),
                        format_ns(r["mean_ns"]),
                        format_ns(r["min_ns"]),
                        str(r["slowest_rank"]),
                    ]
                    for r in slowest
                ],
            )
        ]
        lines += ["", "Stragglers (step time relative to the median rank of each step)"]
        lines += [
            "  " + line
            for line in _table(
                ["rank", "node", "mean relative", "slowest in"],
                [
                    [
                        str(r["rank"]),
                        overview["nodes"][r["node"]],
                        f"{r['mean_relative']:.3f}x",
                        f"{r['slowest_count']} steps",
                    ]
                    for r in steps["stragglers"]
                ],
            )
        ]

    accelerator = data.get("accelerator") or {"recorded": True}
    device = bool(accelerator["recorded"])
    neuron_note = (accelerator.get("neuron") or {}).get("note")
    if neuron_note:
        lines += ["", f"Neuron capture: {neuron_note}"]
    if device:
        device_time = data["device_time"]
        lines += [
            "",
            f"Device time: active {format_ns(device_time['active_ns'])}, idle "
            f"{format_ns(device_time['idle_ns'])} ({100 * device_time['active_share']:.1f} % "
            "active, summed over ranks)",
        ]
        utilisation = data["utilisation"]
        lines += ["", "Device utilisation (mean busy fraction per node)"]
        for node, row in zip(overview["nodes"], utilisation["node_busy"], strict=True):
            values = [v for v in row if v is not None]
            lines.append(f"  {node}: {100 * (sum(values) / len(values) if values else 0):.1f} %")
    else:
        window = accelerator.get("window")
        where = f" (steps {window[0]}-{window[1]})" if window else ""
        lines += [
            "",
            "Accelerator: NO ACCELERATOR ACTIVITY RECORDED",
            f"  why: {accelerator['reason']}",
            "  Device time, utilisation, activity, kernels, precision and launch latency do not "
            "apply; the host operations",
            f"  of the torch.profiler window{where} are shown where device kernels would be.",
        ]

    lines += ["", "Host CPU (busy cores, mean over the sampled span)"]
    for cpu in data["cpu"]:
        lines.append(
            f"  {cpu['node']}: training processes {cpu['process_mean_cores']:.2f} cores "
            f"({cpu['process_active_ns'] / 1e9:.2f} core-s), whole host "
            f"{cpu['host_mean_cores']:.2f} cores ({cpu['host_active_ns'] / 1e9:.2f} core-s)"
        )

    if device:
        activity = data["activity"]["shares"]
        lines += ["", "Device activity (share of capture window)"]
        lines.append(
            "  " + "  ".join(f"{key} {100 * value:.1f} %" for key, value in activity.items())
        )
        lines += _transfer_table("Memory operations", data["memory_ops"])
        lines += _transfer_table("Collectives", data["collectives"])

        lines += _ops_table("Top kernels by time", data["kernels"], "by_time", top)
        lines += _ops_table("Top kernels by count", data["kernels"], "by_count", top)
        lines += _ops_table("Top host ops by time", data["host_ops"], "by_time", top)

        lines += ["", "Precision (share of kernel time)"]
        lines.append(
            "  "
            + "  ".join(f"{p['precision']} {100 * p['share']:.1f} %" for p in data["precision"])
        )

        latency = data["launch_latency"]
        lat = latency["stats"]
        lines += ["", f"Launch -> execution latency ({latency['matched']:,} linked launches)"]
        if lat["count"]:
            lines.append(_stats_line(lat))
        if latency["unmatched_launches"] or latency["unmatched_kernels"]:
            lines.append(
                f"  unlinked: {latency['unmatched_launches']} launches, "
                f"{latency['unmatched_kernels']} executions"
            )
    else:
        title = "Host ops of the torch.profiler window (in place of device kernels)"
        lines += _ops_table(f"{title}, by time", data["host_ops"], "by_time", top)
        lines += _ops_table(f"{title}, by count", data["host_ops"], "by_count", top)

    lines += ["", "Annotations"]
    lines += [
        "  " + line
        for line in _table(
            ["name", "count", "total", "mean", "p50", "p99"],
            [
                [
                    a["name"],
                    f"{a['stats']['count']:,}",
                    format_ns(a["stats"]["total_ns"]),
                    format_ns(a["stats"]["mean_ns"]),
                    format_ns(a["stats"]["p50_ns"]),
                    format_ns(a["stats"]["p99_ns"]),
                ]
                for a in data["annotations"]
            ],
        )
    ]
    return "\n".join(lines) + "\n"

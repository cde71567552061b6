"""The profile's dashboard as plain data (for the web UI's JSON) and as a text report."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from trainium_operator.analysis.columns import F64
from trainium_operator.analysis.loading import LoadedProfile
from trainium_operator.analysis.stats import (
    DurationStats,
    Histogram,
    activity_breakdown,
    annotation_histogram,
    annotation_table,
    launch_latency,
    precision_breakdown,
    step_summary,
    top_kernels,
    utilisation_over_time,
)


def _stats(stats: DurationStats) -> dict[str, Any]:
    return dataclasses.asdict(stats)


def _histogram(histogram: Histogram) -> dict[str, Any]:
    return {"edges": histogram.edges.tolist(), "counts": histogram.counts.tolist()}


def _finite(values: F64) -> list[float | None]:
    return [None if math.isnan(v) else round(float(v), 4) for v in values.tolist()]


def profile_overview(profile: LoadedProfile) -> dict[str, Any]:
    manifest = profile.manifest
    return {
        "path": str(profile.path),
        "job_name": manifest.job_name,
        "namespace": manifest.namespace,
        "uid": manifest.uid,
        "attempt": manifest.attempt,
        "created": manifest.created,
        "step_window": list(manifest.step_window) if manifest.step_window else None,
        "nodes": list(profile.nodes),
        "ranks": len(profile.ranks),
        "events": len(profile.columns),
        "duration_ns": profile.end_ns,
        "origin_wall_ns": profile.origin_wall_ns,
        "dropped_events": sum(rank.dropped_events for rank in profile.ranks),
        "load_seconds": round(profile.load_seconds, 3),
        "warnings": profile.warnings(),
    }


def dashboard(profile: LoadedProfile, buckets: int = 240, top: int = 15) -> dict[str, Any]:
    """Everything the dashboard page draws, computed once per loaded profile."""
    columns = profile.columns
    utilisation = utilisation_over_time(
        columns, len(profile.nodes), 0, max(profile.end_ns, 1), buckets
    )
    steps = step_summary(columns)
    latency = launch_latency(columns)
    activity = activity_breakdown(columns)
    annotations = annotation_table(columns)
    all_kernels = top_kernels(columns)
    return {
        "overview": profile_overview(profile),
        "utilisation": {
            "bucket_start_ns": utilisation.bucket_start_ns.tolist(),
            "bucket_ns": utilisation.bucket_ns,
            "node_busy": [_finite(row) for row in utilisation.node_busy],
            "node_cpu_cores": [_finite(row) for row in utilisation.node_cpu_cores],
            "devices": [{"node": node, "device": device} for node, device in utilisation.devices],
            "device_mean_busy": [round(float(row.mean()), 4) for row in utilisation.device_busy],
        },
        "kernels": {
            "distinct": len(all_kernels),
            "count": sum(row.count for row in all_kernels),
            "total_ns": sum(row.total_ns for row in all_kernels),
            "top": [dataclasses.asdict(row) for row in all_kernels[:top]],
            "all": [dataclasses.asdict(row) for row in all_kernels[:500]],
        },
        "steps": {
            "rows": [dataclasses.asdict(row) for row in steps.rows],
            "stats": _stats(steps.stats),
            "histogram": _histogram(steps.histogram),
        },
        "precision": [dataclasses.asdict(row) for row in precision_breakdown(columns)],
        "activity": {"totals_ns": activity.totals_ns, "shares": activity.shares()},
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
        "annotations": [{"name": row.name, "stats": _stats(row.stats)} for row in annotations],
    }


def annotation(profile: LoadedProfile, name: str, bins: int = 40) -> dict[str, Any]:
    rows = [row for row in annotation_table(profile.columns) if row.name == name]
    return {
        "name": name,
        "stats": _stats(rows[0].stats) if rows else None,
        "histogram": _histogram(annotation_histogram(profile.columns, name, bins)),
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


def text_report(profile: LoadedProfile, top: int = 15) -> str:
    data = dashboard(profile, buckets=100, top=top)
    overview = data["overview"]
    lines = [
        f"Profile {overview['path']}",
        f"  job {overview['namespace']}/{overview['job_name']} (uid {overview['uid'] or '-'}, "
        f"attempt {overview['attempt']}), created {overview['created'] or '-'}",
        f"  {len(overview['nodes'])} nodes, {overview['ranks']} ranks, "
        f"{overview['events']:,} events over {format_ns(overview['duration_ns'])}, "
        f"loaded in {overview['load_seconds']:.2f} s",
    ]
    for warning in overview["warnings"]:
        lines.append(f"  warning: {warning}")

    steps = data["steps"]
    stats = steps["stats"]
    lines += ["", f"Steps ({stats['count']} with markers; step time = slowest rank)"]
    if stats["count"]:
        lines.append(
            f"  mean {format_ns(stats['mean_ns'])}  p50 {format_ns(stats['p50_ns'])}  "
            f"p90 {format_ns(stats['p90_ns'])}  p99 {format_ns(stats['p99_ns'])}  "
            f"max {format_ns(stats['max_ns'])}"
        )
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

    utilisation = data["utilisation"]
    lines += ["", "Device utilisation (mean busy fraction per node)"]
    for node, row in zip(overview["nodes"], utilisation["node_busy"], strict=True):
        values = [v for v in row if v is not None]
        lines.append(f"  {node}: {100 * (sum(values) / len(values) if values else 0):.1f} %")

    activity = data["activity"]["shares"]
    lines += ["", "Device activity (share of capture window)"]
    lines.append("  " + "  ".join(f"{key} {100 * value:.1f} %" for key, value in activity.items()))

    kernels = data["kernels"]
    lines += [
        "",
        f"Top kernels ({kernels['distinct']} distinct, {kernels['count']:,} runs, "
        f"{format_ns(kernels['total_ns'])})",
    ]
    lines += [
        "  " + line
        for line in _table(
            ["kernel", "count", "total", "mean", "p50", "p99", "share"],
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
                for k in kernels["top"]
            ],
        )
    ]

    lines += ["", "Precision (share of kernel time)"]
    lines.append(
        "  " + "  ".join(f"{p['precision']} {100 * p['share']:.1f} %" for p in data["precision"])
    )

    latency = data["launch_latency"]
    lat = latency["stats"]
    lines += ["", f"Launch -> execution latency ({latency['matched']:,} linked launches)"]
    if lat["count"]:
        lines.append(
            f"  mean {format_ns(lat['mean_ns'])}  p50 {format_ns(lat['p50_ns'])}  "
            f"p90 {format_ns(lat['p90_ns'])}  p99 {format_ns(lat['p99_ns'])}  "
            f"max {format_ns(lat['max_ns'])}"
        )
    if latency["unmatched_launches"] or latency["unmatched_kernels"]:
        lines.append(
            f"  unlinked: {latency['unmatched_launches']} launches, "
            f"{latency['unmatched_kernels']} executions"
        )

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

"""Benchmark: how fast the profile UI opens a ~1M-event, 2-node x 32-rank profile.

Run:  .venv/bin/python tests/bench/bench_ui.py [--dir DIR] [--workers N] [--no-peer]

It writes (or reuses) a synthetic profile with the real rank-file writer, starts the real
server (`trainium-operator profile serve`) as a subprocess, with a summary cache of its own,
and opens `#/dashboard?profile=<id>` in headless Chromium, which reports the dashboard's first
paint (the page's `dashboard-painted` mark, from navigation start: page, load, dashboard and
drawing). Twice, each time with a new server process:
  * first open: the summary cache is empty, so every rank file is summarised;
  * reopen: the summaries are cached (a UI that has opened the profile before, or a restart);
then, over HTTP, the timeline open (track tree + first window for the tracks on screen, which
decodes their ranks) and a zoom to a step. It samples the resident memory of the server (its
VmHWM) and of its process tree with the decode workers. As a peer it writes the same events as
Kineto-style Chrome trace JSON and loads it with `json.load` in a fresh process (the first
step of every JSON-based tool: TensorBoard's plugin, HTA, chrome://tracing), reporting time,
peak RSS and the ratios. The targets are printed with the measured figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

# Run as a script: the synthetic profile writer lives with the tests (tests/support).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from browser import CHROMIUM, LAUNCH_FLAGS
from support.local_server import free_port, wait_answering
from support.synthetic import (
    SyntheticSpec,
    expected_event_count,
    write_synthetic_profile,
)
from trainium_operator.analysis.loading import load_profile
from trainium_operator.profiler.events import EventKind

BENCH_SPEC = SyntheticSpec(
    nodes=2, ranks_per_node=32, steps=12, detailed_steps=(2, 9), kernels_per_step=650, step_ms=150.0
)
SCREEN_WIDTH_PX = 1350
SCREEN_TRACKS = 40
TARGET_FIRST_PAINT_S = 0.5
TARGET_SERVER_PEAK_MIB = 256


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return 0
    return 0


def _hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(children.get(current, []))
    return found


class TreeSampler(threading.Thread):
    """Peak summed RSS of a process and its descendants, sampled every 20 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kib = 0
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.peak_kib = max(self.peak_kib, sum(_rss_kib(p) for p in _tree(self.pid)))
            time.sleep(0.02)


def _timed(url: str, method: str = "GET") -> tuple[float, Any]:
    began = time.perf_counter()
    request = urllib.request.Request(url, method=method, headers={"X-Trainium-UI": "1"})
    with urllib.request.urlopen(request, timeout=600) as response:
        body = json.loads(response.read())
    return time.perf_counter() - began, body


def ensure_profile(directory: Path) -> Path:
    if (directory / "profile.json").exists():
        return directory
    began = time.perf_counter()
    write_synthetic_profile(directory, BENCH_SPEC)
    print(f"generated {directory} in {time.perf_counter() - began:.1f} s", flush=True)
    return directory


def first_paint(browser: Any, base: str, profile_id: str) -> float:
    """Seconds from navigation start to the dashboard's first paint, in a fresh context."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        page.goto(f"{base}/#/dashboard?profile={profile_id}")
        page.wait_for_selector("main[data-ready=dashboard]", timeout=600_000)
        marks = page.evaluate(
            "performance.getEntriesByName('dashboard-painted').map(m => m.startTime)"
        )
        return float(marks[0]) / 1000.0
    finally:
        context.close()


def bench_server(
    directory: Path, workers: int | None, cache: Path, browser: Any, *, timeline: bool
) -> dict[str, float]:
    """One server process: the dashboard's first paint in Chromium, then (with `timeline`)
    the timeline over HTTP; the server's peak memory throughout."""
    port = free_port()
    command = [
        str(Path(sys.executable).parent / "trainium-operator"),
        "profile",
        "serve",
        str(directory.parent),
        "--port",
        str(port),
        "--summary-cache",
        str(cache),
    ]
    if workers is not None:
        command += ["--workers", str(workers)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_answering(f"{base}/healthz", server, 60)
        idle_kib = _rss_kib(server.pid)
        sampler = TreeSampler(server.pid)
        sampler.start()
        profile_id = directory.name
        paint_s = first_paint(browser, base, profile_id)
        result = {"first_paint_s": paint_s, "server_idle_mib": idle_kib / 1024}
        if timeline:
            _, dashboard = _timed(f"{base}/api/dashboard?id={profile_id}")
            tracks_s, tracks = _timed(f"{base}/api/tracks?id={profile_id}")
            on_screen = [
                t["id"] for node in tracks["nodes"] for r in node["ranks"] for t in r["tracks"]
            ]
            track_list = ",".join(map(str, on_screen[:SCREEN_TRACKS]))
            window = (
                f"{base}/api/window?id={profile_id}&width={SCREEN_WIDTH_PX}&tracks={track_list}"
            )
            first_s, first = _timed(f"{window}&start=0&end={tracks['end_ns']}")
            step = tracks["steps"][len(tracks["steps"]) // 2]
            zoom_s, _ = _timed(f"{window}&start={step['start_ns']}&end={step['end_ns']}")
            result |= {
                "events": dashboard["overview"]["events"],
                "timeline_open_s": tracks_s + first_s,
                "zoom_to_step_s": zoom_s,
                "first_window_bytes": len(json.dumps(first)),
            }
        sampler.stop.set()
        sampler.join()
        return result | {
            "server_hwm_mib": _hwm_kib(server.pid) / 1024,
            "tree_peak_mib": sampler.peak_kib / 1024,
        }
    finally:
        server.terminate()
        server.wait(30)


def write_chrome_json(directory: Path, target: Path) -> int:
    """The same events as a Kineto-style Chrome trace (X slices, counters, ac2g flows)."""
    profile = load_profile(directory)
    columns = profile.columns
    names = columns.names
    with open(target, "w") as out:
        out.write('{"schemaVersion":1,"traceEvents":[\n')
        first = True
        for i in range(len(columns)):
            kind = int(columns.kind[i])
            ts = columns.start_ns[i] / 1000.0
            pid = int(columns.rank[i])
            tid = int(columns.thread_id[i])
            records: list[dict[str, Any]]
            if kind in (EventKind.CPU_UTIL, EventKind.MEMORY, EventKind.COUNTER):
                records = [
                    {
                        "ph": "C",
                        "name": names[columns.name[i]],
                        "pid": pid,
                        "ts": ts,
                        "args": {"value": int(columns.value[i])},
                    }
                ]
            else:
                record: dict[str, Any] = {
                    "ph": "X",
                    "cat": EventKind(kind).name.lower(),
                    "name": names[columns.name[i]],
                    "pid": pid,
                    "tid": tid if columns.device[i] < 0 else f"stream {tid}",
                    "ts": ts,
                    "dur": columns.duration_ns[i] / 1000.0,
                    "args": {
                        "External id": int(columns.flow_id[i]),
                        "device": int(columns.device[i]),
                    },
                }
                records = [record]
                if columns.flow_id[i] and kind in (EventKind.LAUNCH, EventKind.KERNEL):
                    flow = {
                        "ph": "s" if kind == EventKind.LAUNCH else "f",
                        "id": int(columns.flow_id[i]),
                        "pid": pid,
                        "tid": record["tid"],
                        "ts": ts,
                        "cat": "ac2g",
                        "name": "ac2g",
                    }
                    if kind == EventKind.KERNEL:
                        flow["bp"] = "e"
                    records.append(flow)
            for item in records:
                out.write(("" if first else ",\n") + json.dumps(item, separators=(",", ":")))
                first = False
        out.write("\n]}\n")
    return target.stat().st_size


_PEER_SCRIPT = """
import json, resource, sys, time
began = time.perf_counter()
with open(sys.argv[1]) as f:
    trace = json.load(f)
kernels = {}
for event in trace["traceEvents"]:
    if event.get("cat") == "kernel":
        kernels[event["name"]] = kernels.get(event["name"], 0.0) + event["dur"]
elapsed = time.perf_counter() - began
print(json.dumps({"seconds": elapsed, "events": len(trace["traceEvents"]),
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def bench_peer(json_path: Path) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", _PEER_SCRIPT, str(json_path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(result.stdout))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--dir", type=Path, default=Path(tempfile.gettempdir()) / "trainium-bench-ui" / "profile"
    )
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args()
    directory = ensure_profile(args.dir)
    profile_bytes = sum(p.stat().st_size for p in directory.rglob("*.trnprof"))
    print(
        f"profile: {directory} ({expected_event_count(BENCH_SPEC):,}+ events, "
        f"{BENCH_SPEC.nodes} nodes x {BENCH_SPEC.ranks_per_node} ranks, "
        f"{profile_bytes / 1e6:.1f} MB on disk)"
    )
    # The UI's own cache: outside the served directory (the server refuses one inside).
    cache = Path(tempfile.mkdtemp(prefix="bench-ui-summaries-"))
    sync_api = __import__("playwright.sync_api", fromlist=["sync_playwright"])
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=LAUNCH_FLAGS
        )
        cold = bench_server(directory, args.workers, cache, browser, timeline=False)
        ours = bench_server(directory, args.workers, cache, browser, timeline=True)
        browser.close()
    summaries_mb = sum(p.stat().st_size for p in cache.glob("*.summary")) / 1e6
    shutil.rmtree(cache, ignore_errors=True)
    print(f"  events                   {ours['events']:,}")
    print(
        f"  dashboard first paint    {ours['first_paint_s']:.2f} s with the summaries cached "
        f"(new server process); {cold['first_paint_s']:.2f} s on first open "
        f"(every rank summarised; {summaries_mb:.1f} MB of summaries)"
    )
    print(
        f"  timeline open            {ours['timeline_open_s'] * 1000:.0f} ms "
        f"(tree + first window of {SCREEN_TRACKS} tracks, decoding their ranks, "
        f"{ours['first_window_bytes'] / 1e3:.0f} kB JSON)"
    )
    print(f"  zoom to a step           {ours['zoom_to_step_s'] * 1000:.0f} ms")
    for label, run in (("reopen", ours), ("first open", cold)):
        print(
            f"  server RSS, {label:<12} idle {run['server_idle_mib']:.0f} MiB, "
            f"peak {run['server_hwm_mib']:.0f} MiB; with decode workers "
            f"{run['tree_peak_mib']:.0f} MiB"
        )
    peak = max(ours["server_hwm_mib"], cold["server_hwm_mib"])
    print("targets:")
    print(
        f"  dashboard first paint    {ours['first_paint_s']:.2f} s (reopen) "
        f"<= {TARGET_FIRST_PAINT_S} s: "
        f"{'met' if ours['first_paint_s'] <= TARGET_FIRST_PAINT_S else 'NOT met'}; "
        f"first open {cold['first_paint_s']:.2f} s: "
        f"{'met' if cold['first_paint_s'] <= TARGET_FIRST_PAINT_S else 'NOT met'}"
    )
    print(
        f"  peak server RSS          {peak:.0f} MiB <= {TARGET_SERVER_PEAK_MIB} MiB: "
        f"{'met' if peak <= TARGET_SERVER_PEAK_MIB else 'NOT met'}"
    )
    if args.no_peer:
        return
    json_path = directory.parent / "peer-trace.json"
    if not json_path.exists():
        began = time.perf_counter()
        write_chrome_json(directory, json_path)
        print(f"peer: wrote Kineto-style Chrome JSON in {time.perf_counter() - began:.1f} s")
    peer = bench_peer(json_path)
    json_bytes = json_path.stat().st_size
    print(
        f"peer: json.load of the same events as Chrome JSON ({json_bytes / 1e6:.0f} MB, "
        f"{peer['events']:,} records)"
    )
    print(
        f"  load + one aggregation   {peer['seconds']:.2f} s, peak RSS {peer['peak_mib']:.0f} MiB"
    )
    print("ratios (peer / ours):")
    print(f"  time to dashboard        {peer['seconds'] / ours['first_paint_s']:.1f}x (reopen)")
    print(f"  peak memory              {peer['peak_mib'] / peak:.1f}x (server)")
    print(f"  bytes on disk            {json_bytes / profile_bytes:.1f}x")


if __name__ == "__main__":
    main()

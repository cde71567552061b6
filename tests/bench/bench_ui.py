"""Benchmark: how fast the profile UI opens a ~1M-event, 2-node x 32-rank profile.

Run:  .venv/bin/python tests/bench/bench_ui.py [--dir DIR] [--workers N] [--runs N]
        [--cold-runs N] [--no-peer]

It writes (or reuses, when written by this rank-file format) a synthetic profile with the real
rank-file writer, starts the real
server (`trainium-operator profile serve`) as a subprocess with a summary cache of its own, and
opens `#/dashboard?profile=<id>` in headless Chromium, which reports the dashboard's first
paint: the page's `dashboard-painted` mark (every panel on screen drawn, after the frame is
painted), from navigation start. Each open is in a new server process and a fresh browser
context:
  * after discovery (the figure held to the target; median of --runs): the server has listed
    the profile (GET /api/profiles, as the Profiles page or the job list does) and summarised
    it in the background; the open reads the composed dashboard from its cache;
  * reopen (median of --runs, interleaved with the above): a restarted UI, summaries and
    dashboard in its cache;
  * cold (median of --cold-runs): a link to a profile the UI never listed, nothing cached:
    the open summarises every rank file while the page shows its progress. Where its time
    goes is measured in a fresh process doing the same steps (decoding the rank files,
    reducing them to summaries, encoding and writing the summaries, composing, the dashboard
    document), beside the page's own timing of the open.
For the median reopen it prints where the time goes (page and scripts, the dashboard's answer,
drawing), then over HTTP the timeline open (track tree + first window for the tracks on screen,
which decodes their ranks) and a zoom to a step: right after the paint in the opens after
discovery (the summaries are composed first), TIMELINE_AFTER_S later in the reopens (the UI
has composed them by then, a second after the open). It samples the resident memory of the server
(its VmHWM) and of its process tree with any decode workers (`--workers`), while it opens and
while it summarises in the background. As a peer it writes the same
events as Kineto-style Chrome trace JSON and loads it with `json.load` in a fresh process (the
first step of every JSON-based tool: TensorBoard's plugin, HTA, chrome://tracing), reporting
time, peak RSS and the ratios. The targets are printed with the measured figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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
from trainium_operator.profiler.format import FORMAT_VERSION

BENCH_SPEC = SyntheticSpec(
    nodes=2, ranks_per_node=32, steps=12, detailed_steps=(2, 9), kernels_per_step=650, step_ms=150.0
)
SCREEN_WIDTH_PX = 1350
SCREEN_TRACKS = 40
TARGET_FIRST_PAINT_S = 0.5
TIMELINE_AFTER_S = 2.0  # a user reading the dashboard before opening the timeline
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


def _cpu_s(pid: int) -> float:
    """CPU time (user + system) of a process so far: less noisy than wall time on a loaded
    machine."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    """The bench's profile, written again when the one there is of another writer's format."""
    stamp = directory / ".bench-format"
    written_by = f"{FORMAT_VERSION}"
    if stamp.is_file() and stamp.read_text() == written_by:
        return directory
    shutil.rmtree(directory, ignore_errors=True)
    began = time.perf_counter()
    write_synthetic_profile(directory, BENCH_SPEC)
    stamp.write_text(written_by)
    print(f"generated {directory} in {time.perf_counter() - began:.1f} s", flush=True)
    return directory


_TIMING = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const resources = performance.getEntriesByType("resource");
  const scripts = resources.filter((r) => r.name.includes("/static/"));
  const opens = resources.filter((r) => r.name.includes("/api/profiles/open"));
  const last = opens[opens.length - 1];
  return {
    painted: performance.getEntriesByName("dashboard-painted")[0].startTime,
    html: nav.responseEnd,
    scripts: Math.max(...scripts.map((r) => r.responseEnd)),
    open_sent: opens[0].startTime,
    open_answered: last.responseEnd,
    open_server: last.responseStart - last.requestStart,
    opens: opens.length,
    parsed: nav.domContentLoadedEventEnd,
  };
}"""


def first_paint(browser: Any, base: str, profile_id: str) -> dict[str, float]:
    """The dashboard's first paint and where its time went (ms from navigation start), in a
    fresh context."""
    context = browser.new_context(viewport={"width": 1600, "height": 1000})
    try:
        page = context.new_page()
        page.goto(f"{base}/#/dashboard?profile={profile_id}")
        page.wait_for_selector("main[data-ready=dashboard]", timeout=600_000)
        return {key: float(value) for key, value in page.evaluate(_TIMING).items()}
    finally:
        context.close()


def summarised_ahead(base: str, profile_id: str) -> float:
    """Lists the profiles (the UI discovers this one) and waits until the server has
    summarised it in the background; the seconds that took."""
    began = time.perf_counter()
    while True:
        _, listing = _timed(f"{base}/api/profiles")
        row = next(row for row in listing["profiles"] if row["id"] == profile_id)
        state = (row.get("summaries") or {}).get("state")
        if state == "ready":
            return time.perf_counter() - began
        if state not in ("queued", "summarising"):
            raise RuntimeError(f"{profile_id} was not summarised ahead: {row}")
        time.sleep(0.05)


def timeline(base: str, profile_id: str) -> dict[str, float]:
    _, dashboard = _timed(f"{base}/api/dashboard?id={profile_id}")
    tracks_s, tracks = _timed(f"{base}/api/tracks?id={profile_id}")
    on_screen = [t["id"] for node in tracks["nodes"] for r in node["ranks"] for t in r["tracks"]]
    track_list = ",".join(map(str, on_screen[:SCREEN_TRACKS]))
    window = f"{base}/api/window?id={profile_id}&width={SCREEN_WIDTH_PX}&tracks={track_list}"
    first_s, first = _timed(f"{window}&start=0&end={tracks['end_ns']}")
    step = tracks["steps"][len(tracks["steps"]) // 2]
    zoom_s, _ = _timed(f"{window}&start={step['start_ns']}&end={step['end_ns']}")
    return {
        "events": dashboard["overview"]["events"],
        "timeline_open_s": tracks_s + first_s,
        "zoom_to_step_s": zoom_s,
        "first_window_bytes": len(json.dumps(first)),
    }


_BREAKDOWN_SCRIPT = """
import json, sys, tempfile, time
from pathlib import Path
began = time.perf_counter()
from trainium_operator.analysis.loading import load_rank_file, read_manifest_or_default
from trainium_operator.analysis.report import dashboard_of
from trainium_operator.analysis.summary import compose, summarise_rank, to_bytes
from trainium_operator.profiler.manifest import discover_rank_files
from trainium_operator.ui.profiles import ready_annotations
from trainium_operator.ui.summary_cache import SummaryCache, StoredDashboard
seconds = {"imports": time.perf_counter() - began}
def timed(key, work):
    began = time.perf_counter()
    result = work()
    seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - began
    return result
root = Path(sys.argv[1])
cache = SummaryCache(Path(tempfile.mkdtemp(prefix="bench-ui-breakdown-")))
paths = [ref.path for ref in discover_rank_files(root)]
summaries, stored = [], 0
for i, path in enumerate(paths):
    timed("decode", lambda: load_rank_file(path))
    summary = timed("summarise", lambda: summarise_rank(path))
    data = timed("encode", lambda: to_bytes(summary))
    timed("write", lambda: cache.put(str(i), data))
    summaries.append(summary)
    stored += len(data)
seconds["summarise"] -= seconds["decode"]  # summarise_rank decodes again: the rest reduces
manifest, problem = read_manifest_or_default(root)
composed = timed("compose", lambda: compose(summaries, root, manifest, problem))
document = timed("dashboard", lambda: dashboard_of(composed.inputs))
timed("dashboard", lambda: StoredDashboard.of(document, ready_annotations(composed, document)))
print(json.dumps({"seconds": seconds, "stored_bytes": stored, "files": len(paths)}))
"""


def cold_breakdown(directory: Path) -> dict[str, Any]:
    """Where a cold open's server time goes, step by step, in a fresh process (what the
    server does on its open's path, one rank file at a time)."""
    result = subprocess.run(
        [sys.executable, "-c", _BREAKDOWN_SCRIPT, str(directory)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(result.stdout))


def bench_server(
    directory: Path, workers: int | None, cache: Path, browser: Any, mode: str
) -> dict[str, Any]:
    """One server process and one open of the dashboard in Chromium (`mode`: cold, ahead
    (listed and summarised in the background first) or reopen, then the timeline over HTTP);
    the server's peak memory throughout."""
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
        result: dict[str, Any] = {"server_idle_mib": idle_kib / 1024}
        if mode == "ahead":
            result["ahead_s"] = summarised_ahead(base, profile_id)
        cpu_before = sum(_cpu_s(p) for p in _tree(server.pid))
        result["paint"] = first_paint(browser, base, profile_id)
        result["open_cpu_s"] = sum(_cpu_s(p) for p in _tree(server.pid)) - cpu_before
        if mode == "reopen":
            time.sleep(TIMELINE_AFTER_S)
        if mode != "cold":
            result |= timeline(base, profile_id)
        sampler.stop.set()
        sampler.join()
        return result | {
            "server_hwm_mib": _hwm_kib(server.pid) / 1024,
            "tree_peak_mib": sampler.peak_kib / 1024,
        }
    finally:
        server.terminate()
        server.wait(30)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return sorted(runs, key=lambda run: run["paint"]["painted"])[len(runs) // 2]


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(run[key] for run in runs))


def paints(runs: list[dict[str, Any]]) -> str:
    return ", ".join(f"{run['paint']['painted'] / 1000:.2f}" for run in runs)


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
    parser.add_argument("--runs", type=int, default=7, help="opens per median figure")
    parser.add_argument("--cold-runs", type=int, default=3, help="cold opens (median)")
    parser.add_argument("--no-peer", action="store_true")
    args = parser.parse_args()
    directory = ensure_profile(args.dir)
    profile_bytes = sum(p.stat().st_size for p in directory.rglob("*.trnprof"))
    print(
        f"profile: {directory} ({expected_event_count(BENCH_SPEC):,}+ events, "
        f"{BENCH_SPEC.nodes} nodes x {BENCH_SPEC.ranks_per_node} ranks, "
        f"{profile_bytes / 1e6:.1f} MB on disk)"
    )
    # The UI's own caches: outside the served directory (the server refuses one inside).
    caches: list[Path] = []

    def new_cache() -> Path:
        caches.append(Path(tempfile.mkdtemp(prefix="bench-ui-summaries-")))
        return caches[-1]

    sync_api = __import__("playwright.sync_api", fromlist=["sync_playwright"])
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=LAUNCH_FLAGS
        )
        cold_runs = [
            bench_server(directory, args.workers, new_cache(), browser, "cold")
            for _ in range(args.cold_runs)
        ]
        # Interleaved, so that both medians see the same load on the machine: each reopen
        # restarts the UI on the cache the open after discovery just filled.
        ahead_runs, reopen_runs = [], []
        for _ in range(args.runs):
            ahead_runs.append(bench_server(directory, args.workers, new_cache(), browser, "ahead"))
            reopen_runs.append(bench_server(directory, args.workers, caches[-1], browser, "reopen"))
        browser.close()
    summaries_mb = sum(p.stat().st_size for p in caches[-1].glob("*.summary")) / 1e6
    for cache in caches:
        shutil.rmtree(cache, ignore_errors=True)
    ahead, ours = median_run(ahead_runs), median_run(reopen_runs)
    ahead_s, ours_s = ahead["paint"]["painted"] / 1000, ours["paint"]["painted"] / 1000
    cold = median_run(cold_runs)
    cold_s = cold["paint"]["painted"] / 1000
    timing = ours["paint"]
    steps = cold_breakdown(directory)
    print(f"  events                   {ours['events']:,}")
    print(
        f"  dashboard first paint    {ahead_s:.2f} s on first open after discovery (median of "
        f"{args.runs}: {paints(ahead_runs)}; summarised in the background in "
        f"{ahead['ahead_s']:.1f} s after the listing)"
    )
    print(
        f"                           {ours_s:.2f} s on reopen in a restarted UI (median of "
        f"{args.runs}: {paints(reopen_runs)})"
    )
    print(
        f"                           {cold_s:.2f} s cold: a link to a profile never listed, "
        f"nothing cached (median of {len(cold_runs)}: {paints(cold_runs)}; every rank file "
        f"summarised while the page shows its progress, {cold['paint']['opens']:.0f} open "
        f"requests; {summaries_mb:.1f} MB of summaries for {profile_bytes / 1e6:.1f} MB of "
        f"rank files); server CPU for the open {median_of(cold_runs, 'open_cpu_s'):.2f} s "
        f"(median; the wall time it would take on an idle core)"
    )
    cold_timing, took = cold["paint"], steps["seconds"]
    print(
        f"  where the cold open goes page {cold_timing['html']:.0f} ms, scripts loaded "
        f"{cold_timing['scripts']:.0f} ms; dashboard asked {cold_timing['open_sent']:.0f} ms, "
        f"answered {cold_timing['open_answered']:.0f} ms; painted {cold_timing['painted']:.0f} ms"
    )
    print(
        f"    its server steps, once in a fresh process ({steps['files']} rank files): "
        + ", ".join(
            f"{label} {took[key] * 1000:.0f} ms"
            for key, label in (
                ("decode", "decode"),
                ("summarise", "reduce to summaries"),
                ("encode", "encode summaries"),
                ("write", "write them"),
                ("compose", "compose"),
                ("dashboard", "dashboard document"),
            )
        )
        + f"; imports {took['imports'] * 1000:.0f} ms (before serving, not on the open's path)"
    )
    print(
        f"  where the reopen goes    page {timing['html']:.0f} ms, scripts loaded "
        f"{timing['scripts']:.0f} ms, parsed {timing['parsed']:.0f} ms; dashboard asked "
        f"{timing['open_sent']:.0f} ms, answered {timing['open_answered']:.0f} ms (server "
        f"{timing['open_server']:.0f} ms); painted {timing['painted']:.0f} ms"
    )
    later = median_of(reopen_runs, "timeline_open_s")
    at_once = median_of(ahead_runs, "timeline_open_s")
    print(
        f"  timeline open            {later * 1000:.0f} ms {TIMELINE_AFTER_S:.0f} s after the "
        f"dashboard, {at_once * 1000:.0f} ms right after its paint (composing the summaries "
        f"first); medians: tree + first window of {SCREEN_TRACKS} tracks, decoding their "
        f"ranks, {ours['first_window_bytes'] / 1e3:.0f} kB JSON"
    )
    print(f"  zoom to a step           {median_of(reopen_runs, 'zoom_to_step_s') * 1000:.0f} ms")
    runs = {"after discovery": ahead_runs, "reopen": reopen_runs, "cold": cold_runs}
    for label, measured in runs.items():
        print(
            f"  server RSS, {label:<16} idle "
            f"{max(run['server_idle_mib'] for run in measured):.0f} MiB, peak "
            f"{max(run['server_hwm_mib'] for run in measured):.0f} MiB; with decode workers "
            f"{max(run['tree_peak_mib'] for run in measured):.0f} MiB"
        )
    peak = max(run["server_hwm_mib"] for measured in runs.values() for run in measured)
    tree_peak = max(run["tree_peak_mib"] for measured in runs.values() for run in measured)
    print(
        f"  load average             {' / '.join(f'{v:.2f}' for v in os.getloadavg())} (1/5/15 min)"
    )
    print("targets:")
    print(
        f"  dashboard first paint    {ahead_s:.2f} s (first open after discovery) "
        f"<= {TARGET_FIRST_PAINT_S} s: "
        f"{'met' if ahead_s <= TARGET_FIRST_PAINT_S else 'NOT met'}; reopen {ours_s:.2f} s: "
        f"{'met' if ours_s <= TARGET_FIRST_PAINT_S else 'NOT met'}; cold {cold_s:.2f} s: "
        f"{'met' if cold_s <= TARGET_FIRST_PAINT_S else 'NOT met'}"
    )
    print(
        f"  peak server RSS          {peak:.0f} MiB <= {TARGET_SERVER_PEAK_MIB} MiB: "
        f"{'met' if peak <= TARGET_SERVER_PEAK_MIB else 'NOT met'}; with decode workers, "
        f"summarising included, {tree_peak:.0f} MiB: "
        f"{'met' if tree_peak <= TARGET_SERVER_PEAK_MIB else 'NOT met'}"
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
    print(
        f"  time to dashboard        {peer['seconds'] / ahead_s:.1f}x (first open after discovery)"
    )
    print(f"  peak memory              {peer['peak_mib'] / peak:.1f}x (server)")
    print(f"  bytes on disk            {json_bytes / profile_bytes:.1f}x")


if __name__ == "__main__":
    main()

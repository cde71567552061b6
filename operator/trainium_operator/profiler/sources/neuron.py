"""Trainium device activity from the Neuron runtime's system (and device) profiles.

UNVERIFIED ON HARDWARE. No exported system profile from a real run is published in a public
repository or in the Neuron docs (searched 2026-12-01: aws-neuron/aws-neuron-sdk holds only
documentation snippets), so the parser follows the documented formats field by field and is
tested on fixtures written from them (tests/profiler/fixtures/neuron/README.md):

- the JSON export of Neuron Explorer (`neuron-explorer view -d <dir> --output-format json`,
  Neuron SDK 2.27+; `tools/neuron-explorer/get-started.rst`) and of its predecessor
  `neuron-profile view` (Neuron Profiler 2.0 user guide, now under `archive/profiler/`):
  `system_profile.json` with `trace_events`, `mem_usage` and `cpu_util`;
- the fields of Neuron Explorer's `SystemProfileEvents` table, profile schema **7.4.0**
  (Neuron SDK **2.31.0**, `tools/neuron-explorer/profile-schema-reference.rst`): `id`, `name`,
  `start_ts`, `end_ts`, `duration_ns`, `trace_event_source` (`neuron_rt`, `neuron_hw`,
  `framework`), `instance_id`, `process_id`, `thread_id`, `nc_idx` (logical NeuronCore),
  `pcore_idx`, `worker_gid`, `flow_id` (list of string-encoded integers),
  `framework_stream_id`, `extra_attributes_json`. Events in either naming are read; numbers
  may be JSON strings (the guide's examples write `"lnc_idx": "0"`, `"process_id": "1627711"`).

Capture (contract/neuron_env.py). On the XLA stack the runtime captures the whole process when
it starts with `NEURON_RT_INSPECT_ENABLE=1` (`neuron_inspect_env()`); on the native stack the
torch source opens TorchNeuron's torch.profiler capture for the step window only. Both write
into the profile directory (`<profile dir>/<node>/neuron`), one directory per process:

    <instance id>_pid_<pid>/<files>               environment-variable capture (XLA)
    <instance id>_pid_<pid>/<timestamp>/<files>   torch.profiler capture (native), one per window

(the layouts of Neuron Explorer's `neuron-explorer inspect` example and of its PyTorch guide's
"Expected output"), holding `ntrace.pb`, `trace_info.pb`, `cpu_util.pb`, `host_mem.pb` and,
with device profiles, `.neff` / `.ntff` files (and `trace.json`, the framework trace, from
torch.profiler). Every such directory holding capture files is a session; a process's
sessions are merged in name order.

Bounds. The tree is on the shared claim, written by the job's own processes: the merge looks
at most MAX_DIR_ENTRIES entries of any directory, MAX_SESSIONS sessions per process, goes no
deeper than the session's subdirectories for exports, never follows a symlink (one where a
directory or file would be is skipped, and files are opened with O_NOFOLLOW) and reads no file
larger than MAX_FILE_BYTES.

Conversion. The `.pb` schemas are not documented; the documented, scriptable form is the JSON
that `neuron-profile view -d <dir> --output-format json` writes (`system_profile.json`, with
`trace_events`, `mem_usage` and `cpu_util`). Its runtime events carry `name`, `timestamp` (Unix
ns; device events already moved to the CPU time domain by the runtime's timestamp sync points),
`duration`, `group` (`nrt-nc-<lnc>` or `framework-<tid>`), `lnc_idx`, `process_id`,
`thread_id`, `type` (99999 = framework) and event attributes such as `size`. They become:

| Neuron event | our kind | track |
|---|---|---|
| `nrt_execute` | LAUNCH | host thread |
| `nc_exec_running` | KERNEL | NeuronCore `lnc_idx`, stream 0 |
| `cc_running` | COLLECTIVE | NeuronCore `lnc_idx`, stream 1 |
| `cc_exec_barrier` | SYNC | NeuronCore `lnc_idx`, stream 1 |
| `nrt_tensor_write` / `_read` / `_copy` | MEMCPY (value = bytes) | host thread |
| other hardware events (`nrt_model_switch`, `hw_notify`) | KERNEL | NeuronCore, stream 0 |
| `numerical_err` | COUNTER (value 1) | NeuronCore |
| `timestamp_sync_point` | dropped (already applied) | |
| other runtime / framework events | HOST_OP | host thread |

Launch-to-run links: an event's `flow_id` list (newer runtimes; the Explorer schema documents
it) when present, else a shared `exec_id`, else the latest unlinked `nrt_execute` on the same
NeuronCore that started before the execution (a heuristic).

Device profiles (the native stack). TorchNeuron's `ProfileMode.DEVICE` capture of the window
leaves `.ntff` files in the session directory. Their raw format is not documented; Neuron
Explorer's Perfetto export is
(`neuron-explorer view -d <dir> --output-format perfetto` writes
`device_profile_model_<id>.pftrace`), and Perfetto's TrackEvent protobuf is, so those files
are read with `perfetto_reader` when present (or produced by that command when the tool is in
the image). Every slice becomes a KERNEL event on the rank's NeuronCore (the logical core its
`nc_exec_running` events ran on), one stream per Perfetto track from stream 16 on, named
`NeuronCore <n> device: <track name>`. Which Neuron activity each track holds is Neuron's
choice and is passed through by name. Timestamps that read as Unix nanoseconds are mapped like
the system profile's; smaller ones (device-relative) are placed so the first slice starts with
the rank's first `nc_exec_running` (a heuristic, recorded in the rank file's extras as
`neuron_device_time_base=anchored`); with neither, the file is counted and left out.

Because the runtime may write its files only when the process exits, conversion normally runs
after training: `python -m trainium_operator.profiler.sources.neuron <profile dir>` merges each
process's events into its rank file (matched by pid). The in-process source does the same at
stop time when the JSON is already there.
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trainium_operator.contract import neuron_env
from trainium_operator.profiler.clock import ClockSyncPoint, WallToMonotonic
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind
from trainium_operator.profiler.format import (
    ProfileFormatError,
    RankFileWriter,
    RankHeader,
    read_rank_file,
)
from trainium_operator.profiler.manifest import discover_rank_files
from trainium_operator.profiler.sources import perfetto_reader
from trainium_operator.profiler.sources.base import ActivitySource, SourceBatch, SourceContext

log = logging.getLogger("trainium_operator.profiler")

SOURCE_NAME = "neuron"
NEURON_SUBDIR = neuron_env.NEURON_SUBDIR
SYSTEM_PROFILE_JSON = "system_profile.json"
FRAMEWORK_EVENT_TYPE = 99999
FLOW_ID_BASE = 1 << 31  # keeps these flows apart from the torch source's (which count from 1)

EXEC_STREAM = 0
CC_STREAM = 1
DEVICE_PROFILE_STREAM_BASE = 16  # a device profile's Perfetto tracks: streams 16, 17, ...
DEVICE_PROFILE_TRACES = "device_profile_model_*.pftrace"  # neuron-explorer's Perfetto export
# 2001-09-09 in Unix ns: device-profile timestamps below it are not wall-clock times.
PLAUSIBLE_UNIX_NS = 10**18

# Bounds on the runtime's output tree (tenant-written, like every file on the shared claim). A
# trn2 node has at most 128 ranks, and a session at most one .ntff per logical core plus a few
# files: these are far above a real capture's counts.
MAX_DIR_ENTRIES = 4096  # entries looked at in any one directory of the tree
MAX_SESSIONS = 8  # sessions merged per process (one per profile window)
MAX_FILE_BYTES = 1 << 30  # a system_profile.json or .pftrace export read whole
PROCESS_DIR = re.compile(r"^[A-Za-z0-9._-]{1,128}_pid_([0-9]{1,10})$")
CAPTURE_FILES = frozenset({SYSTEM_PROFILE_JSON, "ntrace.pb", "trace_info.pb"})
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)

HARDWARE_EVENTS = frozenset(
    {
        "nc_exec_running",
        "cc_running",
        "cc_exec_barrier",
        "numerical_err",
        "nrt_model_switch",
        "nc_model_switch",
        "timestamp_sync_point",
        "hw_notify",
    }
)
_MEMCPY_EVENTS = frozenset({"nrt_tensor_write", "nrt_tensor_read", "nrt_tensor_copy"})


class NeuronProfileError(ValueError):
    """A Neuron system profile that cannot be read; names the file."""


@dataclass
class NeuronConversion:
    """Events converted from one process's system profile."""

    events: list[Event] = field(default_factory=list)
    track_names: dict[tuple[int, int], str] = field(default_factory=dict)
    skipped: int = 0  # events of other processes or of no use to us
    heuristic_links: int = 0  # launch-to-run links found by timing alone


def load_system_profile(path: Path) -> dict[str, Any]:
    """Read `system_profile.json`; accepts the documented object (`trace_events`, also spelt
    `trace_event`) or a bare event list."""
    try:
        data = json.loads(read_regular(path).decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise NeuronProfileError(f"{path}: unreadable Neuron system profile: {exc}") from exc
    if isinstance(data, list):
        return {"trace_events": data}
    if isinstance(data, dict) and "trace_events" not in data and "trace_event" in data:
        data = {**data, "trace_events": data["trace_event"]}
    if not isinstance(data, dict) or not isinstance(data.get("trace_events", []), list):
        raise NeuronProfileError(f"{path}: no trace_events list in Neuron system profile")
    return data


def attribute(raw: Mapping[str, Any], key: str) -> Any:
    """An event attribute: its own field (JSON export) or, in Neuron Explorer's
    SystemProfileEvents rows, inside `extra_attributes_json` (attributes without a column of
    their own, such as `size` and `exec_id`)."""
    if key in raw:
        return raw[key]
    extra = raw.get("extra_attributes_json")
    if isinstance(extra, str) and extra:
        try:
            parsed = json.loads(extra)
        except ValueError:
            return None
        if isinstance(parsed, dict):
            return parsed.get(key)
    return None


def event_start(raw: Mapping[str, Any]) -> int:
    """Unix ns: `timestamp` (JSON export) or `start_ts` (Explorer's SystemProfileEvents)."""
    return _int(raw.get("timestamp", raw.get("start_ts")))


def event_duration(raw: Mapping[str, Any]) -> int:
    """`duration` (JSON export), `duration_ns`, or `end_ts - start_ts` (SystemProfileEvents)."""
    for key in ("duration", "duration_ns"):
        if key in raw:
            return max(_int(raw[key]), 0)
    if "end_ts" in raw:
        return max(_int(raw["end_ts"]) - event_start(raw), 0)
    return 0


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _source_of(raw: Mapping[str, Any]) -> str:
    explicit = raw.get("trace_event_source")
    if isinstance(explicit, str) and explicit:
        return explicit
    if _int(raw.get("type"), -1) == FRAMEWORK_EVENT_TYPE or str(raw.get("group", "")).startswith(
        "framework"
    ):
        return "framework"
    return "neuron_hw" if raw.get("name") in HARDWARE_EVENTS else "neuron_rt"


def _nc_index(raw: Mapping[str, Any]) -> int:
    if "lnc_idx" in raw:
        return _int(raw["lnc_idx"])
    if "nc_idx" in raw:
        return _int(raw["nc_idx"])
    group = str(raw.get("group", ""))
    if group.startswith("nrt-nc-"):
        return _int(group.rsplit("-", 1)[-1])
    return 0


def _flow_keys(raw: Mapping[str, Any]) -> list[str]:
    flows = raw.get("flow_id")
    if flows is None or flows == "":
        return []
    if isinstance(flows, list):
        return [str(f) for f in flows]
    return [str(flows)]


def classify(raw: Mapping[str, Any]) -> tuple[EventKind, int, int] | None:
    """(kind, device, stream-or-thread) for a runtime event, or None to drop it."""
    name = str(raw.get("name", ""))
    source = _source_of(raw)
    if source == "neuron_hw":
        nc = _nc_index(raw)
        if name == "timestamp_sync_point":
            return None
        if name == "cc_running":
            return EventKind.COLLECTIVE, nc, CC_STREAM
        if name == "cc_exec_barrier":
            return EventKind.SYNC, nc, CC_STREAM
        if name == "numerical_err":
            return EventKind.COUNTER, nc, EXEC_STREAM
        return EventKind.KERNEL, nc, EXEC_STREAM
    thread_id = _int(raw.get("thread_id"))
    if source == "framework":
        return EventKind.HOST_OP, HOST_DEVICE, thread_id
    if name == "nrt_execute":
        return EventKind.LAUNCH, HOST_DEVICE, thread_id
    if name in _MEMCPY_EVENTS:
        return EventKind.MEMCPY, HOST_DEVICE, thread_id
    return EventKind.HOST_OP, HOST_DEVICE, thread_id


def convert_system_profile(
    data: Mapping[str, Any],
    pid: int,
    to_monotonic: WallToMonotonic,
    *,
    flow_base: int = FLOW_ID_BASE,
) -> NeuronConversion:
    """This process's events from a system profile, on its monotonic clock (pure). Launch
    links take flow ids from `flow_base` up (a second session continues after the first's)."""
    result = NeuronConversion()
    rows: list[tuple[Mapping[str, Any], EventKind, int, int]] = []
    for raw in data.get("trace_events", []):
        if not isinstance(raw, Mapping) or _int(raw.get("process_id"), -1) != pid:
            result.skipped += 1
            continue
        placed = classify(raw)
        if placed is None:
            result.skipped += 1
            continue
        rows.append((raw, *placed))

    flow_of, heuristic = _link_launches(rows, flow_base)
    result.heuristic_links = heuristic
    for index, (raw, kind, device, thread) in enumerate(rows):
        value = 0
        if kind in (EventKind.MEMCPY, EventKind.COLLECTIVE):
            value = _int(attribute(raw, "size"))
        elif kind == EventKind.COUNTER:
            value = 1
        if device != HOST_DEVICE:
            label = "collectives" if thread == CC_STREAM else "executions"
            result.track_names.setdefault((thread, device), f"NeuronCore {device} {label}")
        result.events.append(
            Event(
                kind=kind,
                name=str(raw.get("name", "")),
                start_ns=to_monotonic(event_start(raw)),
                duration_ns=event_duration(raw),
                thread_id=thread,
                device=device,
                flow_id=flow_of.get(index, 0),
                value=value,
            )
        )
    return result


def _link_launches(
    rows: Sequence[tuple[Mapping[str, Any], EventKind, int, int]], flow_base: int
) -> tuple[dict[int, int], int]:
    """Flow id per row index linking nrt_execute to its nc_exec_running; and heuristic count."""
    flow_of: dict[int, int] = {}
    next_flow = flow_base
    launches = [i for i, (raw, kind, _, _) in enumerate(rows) if kind == EventKind.LAUNCH]
    runs = [i for i, (raw, _, _, _) in enumerate(rows) if raw.get("name") == "nc_exec_running"]

    def link(a: int, b: int) -> None:
        nonlocal next_flow
        flow_of[a] = flow_of[b] = next_flow
        next_flow += 1

    # 1. Explicit flow ids shared by both ends.
    by_flow: dict[str, int] = {}
    for i in launches:
        for key in _flow_keys(rows[i][0]):
            by_flow.setdefault(key, i)
    for i in runs:
        for key in _flow_keys(rows[i][0]):
            launch = by_flow.get(key)
            if launch is not None and launch not in flow_of and i not in flow_of:
                link(launch, i)
                break

    # 2. A shared execution id on the same NeuronCore.
    by_exec: dict[tuple[int, str], int] = {}
    for i in launches:
        raw = rows[i][0]
        exec_id = attribute(raw, "exec_id")
        if i not in flow_of and exec_id is not None:
            by_exec.setdefault((_nc_index(raw), str(exec_id)), i)
    for i in runs:
        raw = rows[i][0]
        exec_id = attribute(raw, "exec_id")
        if i in flow_of or exec_id is None:
            continue
        launch = by_exec.get((_nc_index(raw), str(exec_id)))
        if launch is not None and launch not in flow_of:
            link(launch, i)

    # 3. Timing: the latest unlinked launch on that NeuronCore that started before the run.
    heuristic = 0
    pending: dict[int, list[int]] = {}
    for i in sorted(launches, key=lambda i: event_start(rows[i][0])):
        if i not in flow_of:
            pending.setdefault(_nc_index(rows[i][0]), []).append(i)
    for i in sorted(runs, key=lambda i: event_start(rows[i][0])):
        if i in flow_of:
            continue
        start = event_start(rows[i][0])
        candidates = pending.get(_nc_index(rows[i][0]), [])
        best = None
        for pos in range(len(candidates) - 1, -1, -1):
            if event_start(rows[candidates[pos]][0]) <= start:
                best = pos
                break
        if best is not None:
            link(candidates.pop(best), i)
            heuristic += 1
    return flow_of, heuristic


# ---------------------------------------------------------------------------------------------
# Finding and producing the runtime's output


def read_regular(path: Path, limit: int | None = None) -> bytes:
    """A regular file's bytes, opened without following a symlink; OSError above `limit`
    (MAX_FILE_BYTES by default)."""
    limit = MAX_FILE_BYTES if limit is None else limit
    fd = os.open(path, _OPEN_FLAGS)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if info.st_size > limit:
            raise OSError(f"{path} is larger than {limit} bytes ({info.st_size})")
        return file.read(limit + 1)[:limit]


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    """The first MAX_DIR_ENTRIES entries of a real directory (not a symlink to one), symlinks
    among them left out, sorted by name; [] when it is missing or not a directory."""
    try:
        if not stat.S_ISDIR(os.lstat(directory).st_mode):
            return []
        with os.scandir(directory) as scan:
            found = [e for e in itertools.islice(scan, MAX_DIR_ENTRIES) if not e.is_symlink()]
    except OSError:
        return []
    return sorted(found, key=lambda e: e.name)


def _holds_capture(entries: Iterable[os.DirEntry[str]]) -> bool:
    return any(
        e.is_file(follow_symlinks=False) and (e.name in CAPTURE_FILES or e.name.endswith(".ntff"))
        for e in entries
    )


def capture_dirs(neuron_dir: Path, pid: int) -> list[Path]:
    """The capture sessions of process `pid` under the runtime's output directory: each
    `<instance>_pid_<pid>/` that holds capture files itself, then each of its subdirectories
    that does (`<timestamp>/`), at most MAX_SESSIONS, in that order."""
    sessions: list[Path] = []
    for entry in _entries(neuron_dir):
        match = PROCESS_DIR.match(entry.name)
        if match is None or int(match.group(1)) != pid or not entry.is_dir(follow_symlinks=False):
            continue
        process_dir = Path(entry.path)
        inside = _entries(process_dir)
        if _holds_capture(inside):
            sessions.append(process_dir)
        for child in inside:
            if child.is_dir(follow_symlinks=False) and _holds_capture(_entries(Path(child.path))):
                sessions.append(Path(child.path))
    return sessions[:MAX_SESSIONS]


def device_profiles(capture_dir: Path) -> list[Path]:
    """The session's raw device traces (`.ntff`), regular files only."""
    return [
        Path(e.path)
        for e in _entries(capture_dir)
        if e.name.endswith(".ntff") and e.is_file(follow_symlinks=False)
    ]


def _exports(capture_dir: Path) -> list[Path]:
    """Neuron Explorer's Perfetto exports of a session's device profiles, in the session or
    one directory below it (where the export lands is not documented)."""
    found: list[Path] = []
    for entry in _entries(capture_dir):
        if entry.is_dir(follow_symlinks=False):
            found += [Path(inner.path) for inner in _entries(Path(entry.path)) if _is_export(inner)]
        elif _is_export(entry):
            found.append(Path(entry.path))
    return sorted(found)


def _is_export(entry: os.DirEntry[str]) -> bool:
    return fnmatch.fnmatchcase(entry.name, DEVICE_PROFILE_TRACES) and entry.is_file(
        follow_symlinks=False
    )


# Neuron Explorer (SDK 2.27+) first; `neuron-profile` is its predecessor with the same `view`
# options used here (-d, --output-format json, --ignore-device-profile).
PROFILE_CLIS = ("neuron-explorer", "neuron-profile")
NEURON_BIN = Path("/opt/aws/neuron/bin")


def find_neuron_profile_cli() -> str | None:
    for name in PROFILE_CLIS:
        found = shutil.which(name)
        if found:
            return found
    for name in PROFILE_CLIS:
        default = NEURON_BIN / name
        if default.exists():
            return str(default)
    return None


def system_profile_json(
    capture_dir: Path, cli: str | None, timeout_s: float = 600.0
) -> Path | None:
    """`system_profile.json` for a capture directory, running `neuron-explorer view` (or
    `neuron-profile view`) if needed."""
    existing = capture_dir / SYSTEM_PROFILE_JSON
    if _is_regular(existing):
        return existing
    if cli is None or not _is_regular(capture_dir / "ntrace.pb"):
        return None
    cmd = [
        cli,
        "view",
        "-d",
        str(capture_dir),
        "--output-format",
        "json",
        "--ignore-device-profile",
    ]
    try:
        subprocess.run(cmd, cwd=capture_dir, check=True, capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("%s view failed for %s: %s", Path(cli).name, capture_dir, exc)
        return None
    return existing if _is_regular(existing) else None


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def device_profile_traces(
    capture_dir: Path, cli: str | None, timeout_s: float = 600.0
) -> list[Path]:
    """The Perfetto exports of a capture's device profiles, running `neuron-explorer view
    --output-format perfetto` when there are .ntff files but no export yet."""
    found = _exports(capture_dir)
    if found or cli is None or not device_profiles(capture_dir):
        return found
    cmd = [cli, "view", "-d", str(capture_dir), "--output-format", "perfetto"]
    try:
        subprocess.run(cmd, cwd=capture_dir, check=True, capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("%s view (perfetto) failed for %s: %s", Path(cli).name, capture_dir, exc)
        return []
    return _exports(capture_dir)


def rank_neuron_core(events: Iterable[Event]) -> int | None:
    """The logical NeuronCore a rank's programs ran on (most `nc_exec_running` events)."""
    counts: dict[int, int] = {}
    for event in events:
        if event.name == "nc_exec_running" and event.device != HOST_DEVICE:
            counts[event.device] = counts.get(event.device, 0) + 1
    return max(counts, key=lambda nc: counts[nc]) if counts else None


def first_execution_ns(events: Iterable[Event]) -> int | None:
    starts = [e.start_ns for e in events if e.name == "nc_exec_running"]
    return min(starts) if starts else None


@dataclass
class DeviceConversion:
    """Events of one device-profile export, on the rank's monotonic clock."""

    events: list[Event] = field(default_factory=list)
    track_names: dict[tuple[int, int], str] = field(default_factory=dict)
    time_base: str = "none"  # unix | anchored | none (then no events)
    unmatched: int = 0


def convert_device_profile(
    trace: perfetto_reader.PerfettoTrace,
    nc: int,
    to_monotonic: WallToMonotonic,
    anchor_ns: int | None,
    *,
    stream_base: int = DEVICE_PROFILE_STREAM_BASE,
) -> DeviceConversion:
    """A device profile's slices as KERNEL events on NeuronCore `nc`, one stream per Perfetto
    track from `stream_base` up (pure)."""
    result = DeviceConversion(unmatched=trace.unmatched)
    if not trace.slices:
        return result
    first = min(s.start_ns for s in trace.slices)
    if first >= PLAUSIBLE_UNIX_NS:
        result.time_base = "unix"

        def place(ts: int) -> int:
            return to_monotonic(ts)
    elif anchor_ns is not None:
        result.time_base = "anchored"
        offset = anchor_ns - first

        def place(ts: int) -> int:
            return ts + offset
    else:
        return result
    used = {s.track_uuid for s in trace.slices} | {c.track_uuid for c in trace.counters}
    streams = {uuid: stream_base + index for index, uuid in enumerate(sorted(used))}
    for uuid, stream in streams.items():
        label = trace.track_names.get(uuid) or f"track {uuid}"
        result.track_names[(stream, nc)] = f"NeuronCore {nc} device: {label}"
    for item in trace.slices:
        result.events.append(
            Event(
                kind=EventKind.KERNEL,
                name=item.name,
                start_ns=place(item.start_ns),
                duration_ns=item.duration_ns,
                thread_id=streams[item.track_uuid],
                device=nc,
            )
        )
    for sample in trace.counters:
        result.events.append(
            Event(
                kind=EventKind.COUNTER,
                name=trace.track_names.get(sample.track_uuid) or "device counter",
                start_ns=place(sample.timestamp_ns),
                thread_id=streams[sample.track_uuid],
                device=nc,
                value=round(sample.value),
            )
        )
    return result


def convert_device_profiles(
    traces: Sequence[Path],
    system: NeuronConversion,
    to_monotonic: WallToMonotonic,
    *,
    stream_base: int = DEVICE_PROFILE_STREAM_BASE,
) -> tuple[DeviceConversion, list[tuple[Path, str]]]:
    """Every export of a capture merged into one conversion, and the files that failed."""
    merged = DeviceConversion()
    damaged: list[tuple[Path, str]] = []
    nc = rank_neuron_core(system.events)
    anchor = first_execution_ns(system.events)
    bases: set[str] = set()
    for path in traces:
        try:
            trace = perfetto_reader.read_trace(read_regular(path))
        except (OSError, perfetto_reader.PerfettoFormatError) as exc:
            damaged.append((path, f"unreadable device profile export: {exc}"))
            continue
        base = max((s + 1 for s, _ in merged.track_names), default=stream_base)
        converted = convert_device_profile(
            trace, 0 if nc is None else nc, to_monotonic, anchor, stream_base=base
        )
        merged.events += converted.events
        merged.track_names.update(converted.track_names)
        merged.unmatched += converted.unmatched
        bases.add(converted.time_base)
    merged.time_base = ",".join(sorted(bases)) or "none"
    return merged, damaged


def convert_capture(
    capture_dir: Path,
    pid: int,
    sync: Sequence[ClockSyncPoint],
    cli: str | None,
    *,
    flow_base: int = FLOW_ID_BASE,
) -> NeuronConversion | None:
    path = system_profile_json(capture_dir, cli)
    if path is None:
        return None
    data = load_system_profile(path)
    return convert_system_profile(data, pid, WallToMonotonic(sync), flow_base=flow_base)


# ---------------------------------------------------------------------------------------------
# Merging into rank files after the run


def merge_into_rank_file(
    rank_path: Path,
    events: Iterable[Event],
    track_names: Mapping[tuple[int, int], str],
    source: str,
    extra: Mapping[str, str] | None = None,
) -> None:
    """Rewrite a complete rank file with more events (atomically: write, then rename)."""
    profile = read_rank_file(rank_path)
    header: RankHeader = replace(
        profile.header,
        sources=tuple(dict.fromkeys((*profile.header.sources, source))),
        extra={**profile.header.extra, **(extra or {})},
    )
    merged = sorted([*profile.events, *events], key=lambda e: (e.device, e.thread_id, e.start_ns))
    tmp = rank_path.with_name(f".{rank_path.name}.merge")
    with RankFileWriter(tmp, replace(header, clock_sync=header.clock_sync[:1])) as writer:
        for (thread_id, device), name in {**profile.track_names, **track_names}.items():
            writer.name_track(thread_id, device, name)
        writer.write_sync_points(header.clock_sync[1:])
        writer.write_events(merged)
        writer.close(dropped_events=header.dropped_events)
    os.replace(tmp, rank_path)


@dataclass
class MergeReport:
    merged: list[Path] = field(default_factory=list)
    missing: list[Path] = field(default_factory=list)  # rank files with no Neuron capture found
    already: list[Path] = field(default_factory=list)
    damaged: list[tuple[Path, str]] = field(default_factory=list)  # unreadable rank/Neuron files


@dataclass
class _Merged:
    """What a rank's capture sessions added up to."""

    events: list[Event] = field(default_factory=list)
    track_names: dict[tuple[int, int], str] = field(default_factory=dict)
    sessions: list[Path] = field(default_factory=list)
    device_profiles: int = 0
    exports: int = 0
    device_events: int = 0
    time_bases: set[str] = field(default_factory=set)


def _merge_sessions(
    sessions: Sequence[Path],
    header: RankHeader,
    cli: str | None,
    damaged: list[tuple[Path, str]],
) -> _Merged:
    """Every session of one process converted, with flow ids and device streams continuing
    from one session to the next so they never collide."""
    merged = _Merged()
    flow_base, stream_base = FLOW_ID_BASE, DEVICE_PROFILE_STREAM_BASE
    for session in sessions:
        try:
            converted = convert_capture(
                session, header.pid, header.clock_sync, cli, flow_base=flow_base
            )
        except NeuronProfileError as exc:
            damaged.append((session, str(exc)))
            continue
        if converted is None:
            continue
        traces = device_profile_traces(session, cli)
        device, broken = convert_device_profiles(
            traces, converted, WallToMonotonic(header.clock_sync), stream_base=stream_base
        )
        damaged += broken
        merged.events += [*converted.events, *device.events]
        merged.track_names.update({**converted.track_names, **device.track_names})
        merged.sessions.append(session)
        merged.device_profiles += len(device_profiles(session))
        merged.exports += len(traces) - len(broken)
        merged.device_events += len(device.events)
        merged.time_bases |= set(device.time_base.split(","))
        flow_base = max((e.flow_id + 1 for e in converted.events), default=flow_base)
        stream_base = max((s + 1 for s, _ in device.track_names), default=stream_base)
    if len(merged.time_bases) > 1:
        merged.time_bases.discard("none")  # "none" only when no session placed any
    return merged


def merge_profile_dir(
    profile_dir: Path, node: str | None = None, cli: str | None = None
) -> MergeReport:
    """Merge every rank's Neuron capture sessions into its rank file (idempotent)."""
    report = MergeReport()
    cli = cli or find_neuron_profile_cli()
    for ref in discover_rank_files(profile_dir):
        if node is not None and ref.node != node:
            continue
        try:
            header = read_rank_file(ref.path).header
        except ProfileFormatError as exc:
            report.damaged.append((ref.path, str(exc)))
            continue
        if SOURCE_NAME in header.sources:
            report.already.append(ref.path)
            continue
        sessions = capture_dirs(ref.path.parent / NEURON_SUBDIR, header.pid)
        merged = _merge_sessions(sessions, header, cli, report.damaged)
        if not merged.sessions:
            report.missing.append(ref.path)
            continue
        extra = {
            "neuron_capture_dir": merged.sessions[0].relative_to(profile_dir).as_posix(),
            "neuron_capture_sessions": str(len(merged.sessions)),
            "neuron_device_profiles": str(merged.device_profiles),
            "neuron_device_profile_exports": str(merged.exports),
            "neuron_device_profile_events": str(merged.device_events),
            "neuron_device_time_base": ",".join(sorted(merged.time_bases)) or "none",
        }
        neff_cache = os.environ.get(neuron_env.NEFF_CACHE_DIR)
        if neff_cache:
            # The NEFFs a device profile needs to be opened in Neuron Explorer.
            extra["neuron_neff_cache_dir"] = neff_cache
        merge_into_rank_file(ref.path, merged.events, merged.track_names, SOURCE_NAME, extra)
        report.merged.append(ref.path)
    return report


# ---------------------------------------------------------------------------------------------
# The in-process source


class NeuronRuntimeSource:
    """Converts this process's Neuron system profile at stop, when the runtime has written it.

    Most runtimes write at process exit; then this source adds nothing and the post-run merge
    (`merge_profile_dir`) does the work.
    """

    name = SOURCE_NAME

    def __init__(self, context: SourceContext, neuron_dir: Path) -> None:
        self._context = context
        self._neuron_dir = neuron_dir
        self._done = False

    def start_window(self) -> None:
        return None

    def stop_window(self) -> None:
        return None

    def collect(self, final: bool) -> SourceBatch:
        # Only at the end of the run: the runtime's output is complete by then, if ever.
        if self._done or not final:
            return SourceBatch()
        self._done = True
        from trainium_operator.profiler.clock import take_sync_point

        sync = [self._context.start_sync, take_sync_point()]
        for capture in capture_dirs(self._neuron_dir, self._context.pid):
            path = capture / SYSTEM_PROFILE_JSON
            if _is_regular(path):
                try:
                    data = load_system_profile(path)
                except NeuronProfileError as exc:
                    log.warning("Neuron source: %s", exc)
                    continue
                converted = convert_system_profile(data, self._context.pid, WallToMonotonic(sync))
                return SourceBatch(events=converted.events, track_names=converted.track_names)
        return SourceBatch()

    def close(self) -> None:
        return None


def create(context: SourceContext) -> ActivitySource | None:
    """The Neuron source when the runtime is capturing: through its environment (into the
    directory it names) or through the torch source's window (into this rank's node directory)."""
    if os.environ.get(neuron_env.INSPECT_ENABLE, "0") == "1":
        out = os.environ.get(neuron_env.INSPECT_OUTPUT_DIR, neuron_env.DEFAULT_OUTPUT_DIR)
        return NeuronRuntimeSource(context, Path(out))
    if context.config.neuron_device:
        return NeuronRuntimeSource(context, context.node_dir / NEURON_SUBDIR)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainium_operator.profiler.sources.neuron",
        description="Merge Neuron runtime system profiles into the rank files of a profile.",
    )
    parser.add_argument("profile_dir", type=Path)
    parser.add_argument("--node", help="only this node's directory")
    parser.add_argument("--neuron-profile", dest="cli", help="path of the neuron-profile tool")
    args = parser.parse_args(argv)
    report = merge_profile_dir(args.profile_dir, node=args.node, cli=args.cli)
    for path in report.merged:
        print(f"merged   {path}")
    for path in report.already:
        print(f"had it   {path}")
    for path in report.missing:
        print(f"no data  {path}", file=sys.stderr)
    for path, reason in report.damaged:
        print(f"damaged  {path}: {reason}", file=sys.stderr)
    return 0 if report.merged or report.already or not report.missing else 1


if __name__ == "__main__":
    raise SystemExit(main())

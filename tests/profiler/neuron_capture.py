"""A rank file with a Neuron capture beside it, as the profiler leaves them on a node, and a
stand-in for the Neuron CLI. Built from the documented formats (fixtures/neuron/README.md),
not captured on Trainium hardware."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from profiler.perfetto_fixture import FIXTURES
from trainium_operator.profiler.clock import ClockSyncPoint
from trainium_operator.profiler.events import HOST_DEVICE, Event, EventKind
from trainium_operator.profiler.format import RankHeader, write_rank_file

SYSTEM = FIXTURES / "system_profile.json"
PID = 1627711
# This rank's monotonic clock reads 5 s when the wall clock reads 1729888370 s.
SYNC = ClockSyncPoint(monotonic_ns=5_000_000_000, wall_ns=1_729_888_370_000_000_000)


def rank_file(
    profile_dir: Path, rank: int = 3, world_size: int = 4, step_ns: int = 5_900_000_000
) -> tuple[Path, list[Event]]:
    """One rank's file on node ip-1 holding one 500 ms step of process PID; its host events."""
    path = profile_dir / "ip-1" / f"rank-{rank}.trnprof"
    host = [Event(EventKind.STEP, "step", step_ns, 500_000_000, PID, value=1)]
    header = RankHeader(rank=rank, world_size=world_size, node="ip-1", pid=PID, clock_sync=(SYNC,))
    write_rank_file(path, header, host, track_names={(PID, HOST_DEVICE): "MainThread"})
    return path, host


def system_capture(profile_dir: Path) -> Path:
    """ip-1's capture of process PID: the system profile exported, one raw device trace."""
    capture = profile_dir / "ip-1" / "neuron" / f"i-0f207fb2a99bd2d08_pid_{PID}"
    capture.mkdir(parents=True)
    shutil.copy(SYSTEM, capture / "system_profile.json")
    (capture / "123_instid_0_vnc_0.ntff").write_bytes(b"")
    return capture


# The files of one torch.profiler capture session, as Neuron Explorer's PyTorch guide lists
# them under "Expected output" (the NEFF hashes are made up).
NATIVE_SESSION_FILES = (
    "cpu_util.pb",
    "host_mem.pb",
    "neff_1111_vnc_0.neff",
    "neff_2222_vnc_0.neff",
    "ntrace.pb",
    "profile_nc_0_session_0.ntff",
    "trace.json",
    "trace_info.pb",
)
NATIVE_TIMESTAMP = "20261204T101500"


def native_capture(
    profile_dir: Path, timestamp: str = NATIVE_TIMESTAMP, *, exported: bool = False
) -> Path:
    """ip-1's torch.profiler capture of process PID in the documented native layout,
    `<instance id>_pid_<pid>/<timestamp>/<files>` (raw files; `exported` adds the
    system profile's JSON export, as `neuron-explorer view` leaves it)."""
    session = profile_dir / "ip-1" / "neuron" / f"i-0f207fb2a99bd2d08_pid_{PID}" / timestamp
    session.mkdir(parents=True)
    for name in NATIVE_SESSION_FILES:
        (session / name).write_bytes(b"raw")
    if exported:
        shutil.copy(SYSTEM, session / "system_profile.json")
    return session


def fake_neuron_cli(path: Path, output_format: str, export: Path, name: str = "") -> str:
    """An executable answering only `view -d <capture> <out> --output-format <output_format>`,
    by copying `export` into <out> (as `name` when given)."""
    path.write_text(
        "#!/bin/sh\n"
        '[ "$1" = view ] && [ "$2" = -d ] && [ "$4" = --output-format ] '
        f'&& [ "$5" = {output_format} ] || exit 3\ncp {export} "$3/{name}"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)

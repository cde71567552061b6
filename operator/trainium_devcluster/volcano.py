"""The real Volcano processes of a dev cluster: vc-scheduler and vc-controller-manager.

Both run as background processes in their own session (they outlive `dev up`), with their logs
and pid files beside the cluster's state, health-checked on their `/healthz` endpoints, and are
stopped by `dev down`. The argv builders are pure so tests can check them without a cluster.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from trainium_devcluster import build, paths

SCHEDULER_NAME = "volcano"  # pods with this schedulerName are Volcano's
SCHEDULER_CONF = Path(__file__).parent / "volcano-scheduler.yaml"
# The controllers a bare-pod Volcano user relies on: PodGroups for volcano pods without one
# (pg), queue status and state (queue), and TTL clean-up of finished vcjobs (gc). The job,
# jobflow and jobtemplate controllers act on vcjob objects nobody creates here.
CONTROLLERS = ("+pg-controller", "+queue-controller", "+gc-controller")
HEALTH_TIMEOUT = 60.0


class VolcanoError(RuntimeError):
    """A Volcano process did not start or became unhealthy; the message names its log."""


@dataclass(frozen=True, slots=True)
class Daemon:
    """One background process of one cluster (Volcano's two; Kueue's manager is one too): where
    its pid, health port and log live."""

    name: str  # also the binary's name: vc-scheduler | vc-controller-manager | kueue
    cluster: paths.ClusterPaths

    @property
    def state_dir(self) -> Path:
        return self.cluster.state_dir

    pid_file = paths.FileIn("state_dir", "{name}.pid")
    port_file = paths.FileIn("state_dir", "{name}.healthz-port")
    log = paths.FileIn("state_dir", "{name}.log")
    # The period chosen at `dev up`, kept so a restarted scheduler runs with it again.
    schedule_period_file = paths.FileIn("state_dir", "{name}.schedule-period")

    def schedule_period(self) -> str:
        try:
            return self.schedule_period_file.read_text().strip() or DEFAULT_SCHEDULE_PERIOD
        except OSError:
            return DEFAULT_SCHEDULE_PERIOD


def daemons(cluster: paths.ClusterPaths) -> tuple[Daemon, Daemon]:
    return Daemon("vc-scheduler", cluster), Daemon("vc-controller-manager", cluster)


# Volcano's default scheduling period: the demo and the benchmark keep it, so their figures
# compare with a real cluster's. The tests' session cluster runs a shorter one (every gang waits
# for about two ticks, and the tests start hundreds of gangs).
DEFAULT_SCHEDULE_PERIOD = "1s"
TEST_SCHEDULE_PERIOD = "200ms"


def scheduler_argv(
    binary: Path,
    kubeconfig: Path,
    *,
    healthz_port: int,
    metrics_port: int,
    schedule_period: str = DEFAULT_SCHEDULE_PERIOD,
) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--scheduler-conf={SCHEDULER_CONF}",
        f"--scheduler-name={SCHEDULER_NAME}",
        # One scheduler per dev cluster: no Lease to wait for on a restart.
        "--leader-elect=false",
        "--enable-healthz=true",
        f"--healthz-address=127.0.0.1:{healthz_port}",
        f"--listen-address=127.0.0.1:{metrics_port}",
        "--enable-metrics=true",
        f"--schedule-period={schedule_period}",
        # The cache dumper writes into /tmp on SIGUSR2; nothing here asks for it.
        "--cache-dumper=false",
        "--logtostderr=true",
        "-v=3",
    ]


def controller_manager_argv(binary: Path, kubeconfig: Path, *, healthz_port: int) -> list[str]:
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--scheduler-name={SCHEDULER_NAME}",
        "--leader-elect=false",
        f"--controllers={','.join(CONTROLLERS)}",
        "--enable-healthz=true",
        f"--healthz-address=127.0.0.1:{healthz_port}",
        "--logtostderr=true",
        "-v=2",
    ]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def running_pid(daemon: Daemon) -> int | None:
    """The daemon's pid if that process is alive and is our binary (not a recycled pid)."""
    try:
        pid = int(daemon.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (ProcessLookupError, FileNotFoundError):
        return None
    except PermissionError:
        return pid
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "?"
    if state == "Z":
        return None
    return pid if daemon.name.encode() in cmdline else None


def healthz_port(daemon: Daemon) -> int | None:
    try:
        return int(daemon.port_file.read_text().strip())
    except (OSError, ValueError):
        return None


def healthy(daemon: Daemon, endpoint: str = "/healthz") -> bool:
    port = healthz_port(daemon)
    if port is None:
        return False
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{endpoint}", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def log_tail(daemon: Daemon, lines: int = 20) -> str:
    try:
        return "".join(daemon.log.read_text(errors="replace").splitlines(keepends=True)[-lines:])
    except OSError:
        return "(no log)"


def _start(daemon: Daemon, toolchain: build.Toolchain) -> subprocess.Popen[bytes]:
    binary = toolchain.binary(daemon.name)
    kubeconfig = daemon.cluster.kubeconfig
    port = free_port()
    if daemon.name == "vc-scheduler":
        argv = scheduler_argv(
            binary,
            kubeconfig,
            healthz_port=port,
            metrics_port=free_port(),
            schedule_period=daemon.schedule_period(),
        )
    else:
        argv = controller_manager_argv(binary, kubeconfig, healthz_port=port)
    return launch(daemon, argv, healthz_port=port)


def launch(daemon: Daemon, argv: list[str], *, healthz_port: int) -> subprocess.Popen[bytes]:
    """Starts `argv` in its own session (it outlives `dev up`), logging to the daemon's log,
    and records its pid and health port."""
    daemon.cluster.state_dir.mkdir(parents=True, exist_ok=True)
    with daemon.log.open("a") as log:
        log.write(f"$ {' '.join(argv)}\n")
        log.flush()
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    daemon.pid_file.write_text(f"{process.pid}\n")
    daemon.port_file.write_text(f"{healthz_port}\n")
    return process


def start(
    cluster: paths.ClusterPaths, toolchain: build.Toolchain, *, schedule_period: str | None = None
) -> dict[str, int]:
    """Starts whichever Volcano process is not running and waits until both are healthy; a
    `schedule_period` given is kept for later starts (else the one kept, else Volcano's 1 s)."""
    if schedule_period is not None:
        scheduler = daemons(cluster)[0]
        scheduler.schedule_period_file.parent.mkdir(parents=True, exist_ok=True)
        scheduler.schedule_period_file.write_text(f"{schedule_period}\n")
    pids: dict[str, int] = {}
    started: dict[str, subprocess.Popen[bytes]] = {}
    for daemon in daemons(cluster):
        # A running one is left alone (a stuck one is reported below, with its log).
        pid = running_pid(daemon)
        if pid is None:
            started[daemon.name] = _start(daemon, toolchain)
            pid = started[daemon.name].pid
        pids[daemon.name] = pid
    deadline = time.monotonic() + HEALTH_TIMEOUT
    for daemon in daemons(cluster):
        failure = wait_healthy(daemon, started.get(daemon.name), deadline=deadline)
        if failure:
            raise VolcanoError(failure)
    return pids


def wait_healthy(
    daemon: Daemon,
    process: subprocess.Popen[bytes] | None,
    *,
    deadline: float,
    endpoint: str = "/healthz",
) -> str | None:
    """Waits until `endpoint` answers 200; else says why not (exited, or still unhealthy at
    `deadline`, a time.monotonic() value), with the log's tail. `process`: the one just started,
    if it was."""
    while not healthy(daemon, endpoint):
        # For a process we just started, ask it: until it has exec'd, /proc shows our own
        # command line, and running_pid would call it gone.
        exited = process.poll() is not None if process else running_pid(daemon) is None
        if exited:
            return f"{daemon.name} exited during start-up; log {daemon.log}:\n{log_tail(daemon)}"
        if time.monotonic() > deadline:
            return (
                f"{daemon.name} not healthy ({endpoint}) in time; log {daemon.log}:\n"
                f"{log_tail(daemon)}"
            )
        time.sleep(0.2)
    return None


def stop(cluster: paths.ClusterPaths, *, timeout: float = 10.0) -> list[str]:
    """SIGTERM, then SIGKILL after `timeout`; returns the names of the processes stopped."""
    return [daemon.name for daemon in daemons(cluster) if stop_daemon(daemon, timeout=timeout)]


def stop_daemon(daemon: Daemon, *, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after `timeout`; True if the process was running."""
    pid = running_pid(daemon)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and running_pid(daemon) is not None:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            time.sleep(0.1)
        if running_pid(daemon) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    daemon.pid_file.unlink(missing_ok=True)
    daemon.port_file.unlink(missing_ok=True)
    return pid is not None

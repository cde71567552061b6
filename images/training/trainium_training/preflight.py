"""The gang preflight: before a stage trains, check every node of the gang against the others.

    python3 -m trainium_training.preflight --nnodes=4 --rdzv-backend=c10d \\
        --rdzv-endpoint=<host:port> --rdzv-id=<run id> --timeout=300 --threshold=0.25 \\
        --devices=neuron --expected-devices=16 --report=/dev/termination-log \\
        -- torchrun ... pretrain.py ...

One process per pod. The operator writes this command (`trainium_operator.contract.preflight`
`argv`, which also holds the report format and the rule `judge`). Each process:
1. checks its node's devices: `neuron`: `neuron-ls` (JSON output, either SDK's shape), the
   count found and whether each is usable; `cpu` (the local runner's stand-in for a node's
   devices): the host, found and healthy;
2. joins the gang through torch's elastic launcher (the rendezvous torchrun uses, with the
   run id given): one worker per node, gloo, which measures
   - the node's device throughput: `cpu`: a fixed tensor workload, in the CPU time it took
     (`CpuWorkload`: why not wall time), nodes on one machine taking turns; `neuron`: a
     single-node all-reduce over the node's NeuronCores with `nccom-test` (its "Avg bus
     bandwidth");
   - the gang's all-reduce bus bandwidth (every node reaches every other);
   - the node's network figure: it streams a fixed amount of data to its ring neighbour at
     shift 1 and 2 while receiving from the neighbour on the other side, and its best
     one-direction rate is its figure (see `ring_gbps`: why the best, and why per direction);
   - then gathers every node's report and judges the gang (`judge`, against `--threshold`);
     a figure that judges a node unfit is measured once more, every node's figures the best
     of its two rounds, and judged again (`needs_confirming`: why);
3. writes its own node's report (JSON) to `--report`, prints the gang's figures and any unfit
   node to stderr, and then: every node fit: `exec`s the stage command (it becomes the
   container's main process, with this PID and its signals); any node unfit: exits 86
   (EXIT_UNFIT), on every node, so nothing trains; the check not finished within `--timeout`
   seconds (a node that never joined, or one that left or hung during the check): exits 87
   (EXIT_TIMEOUT) with outcome `timeout`. A report's outcome is what its node did: `passed`
   (ran the stage), `unfit` (the gang was unfit) or `timeout`.

Bounds: the whole check is bounded by `--timeout` (a watchdog ends it, and the processes it
started, when the time is up); the rendezvous, the process group and every external tool have
their own timeouts within it.

The rendezvous endpoint should be another port than the stage's torchrun's: the node hosting
the preflight's rendezvous store keeps it until it execs the stage, and a node whose stage
starts first would otherwise reach the old store instead of the new one.

The `neuron` device throughput (nccom-test) has not run on Trainium hardware here: its output
parser follows the format in the NCCOM-TEST user guide (Neuron docs).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import json
import math
import os
import re
import resource
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

if __name__ == "__main__" and not __package__:
    # Run as a file: import the packages from the image's root, not from this folder.
    sys.path[0] = str(Path(__file__).resolve().parent.parent)

from trainium_operator.contract import neuron_ls, workload_env
from trainium_operator.contract import preflight as contract

PROG: Final = f"python3 -m {contract.MODULE}"
MAX_NODES: Final = 4096

# The fixed workloads: small enough that the whole check takes seconds, large enough that each
# timed piece is more than the buffers on its way hold (caches, socket buffers) and spans many
# scheduler slices (a node stalled now and then must not look fast on the network).
DEVICE_ELEMENTS: Final = 1 << 22  # three float32 tensors of 16 MiB: out = a + b
DEVICE_ADDS: Final = 8  # per timed repeat: 400 MB of memory traffic
DEVICE_REPEATS: Final = 5
GANG_ELEMENTS: Final = 1 << 20  # a 4 MiB all-reduce
GANG_ITERATIONS: Final = 3
RING_ELEMENTS: Final = 1 << 20  # 4 MiB messages
RING_MESSAGES: Final = 8  # 32 MiB each way per shift: more than socket buffers usually hold
RING_SHIFTS: Final = (1, 2)
BYTES_PER_ELEMENT: Final = 4  # float32
GIB_IN_GB: Final = (1 << 30) / 1e9

# The node hosting the rendezvous store (the launcher picks it) must outlive the other nodes'
# last calls to it (the end of the agent's exit barrier, closing the rendezvous); which node
# hosts it is the launcher's own business, so every node waits this long before it goes.
LINGER_SECONDS: Final = 0.5

NEURON_LS_SECONDS: Final = 30.0
NCCOM_TEST_SECONDS: Final = 300.0
NCCOM_TEST_ARGV: Final = ("nccom-test", "-r")  # + the node's NeuronCore count, "allr"
# "Avg bus bandwidth:      40.6901GB/s": the last line of nccom-test's table (its user guide).
_AVG_BUS_BANDWIDTH = re.compile(
    r"^\s*Avg bus bandwidth:\s*([0-9]+(?:\.[0-9]+)?)\s*GB/s\s*$", re.MULTILINE
)


# --- command line ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    nnodes: int
    rdzv_backend: str
    rdzv_endpoint: str
    rdzv_id: str
    timeout: int  # seconds, the whole check
    threshold: float
    devices: str
    expected_devices: int
    report: Path
    command: tuple[str, ...]  # the stage command, exec'd once the gang passed


def _bounded_int(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in {low}..{high}")
        return value

    return parse


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        usage=f"{PROG} [options] {contract.COMMAND_SEPARATOR} STAGE_COMMAND [ARG ...]",
        description="Check a gang's nodes (devices, device throughput, network) against each "
        "other, then exec the stage command if every node is fit.",
        epilog=f"Exit codes: {contract.EXIT_UNFIT} a node of the gang is unfit; "
        f"{contract.EXIT_TIMEOUT} the check did not finish within --timeout.",
    )
    required = parser.add_argument_group("required")
    required.add_argument("--nnodes", type=_bounded_int(1, MAX_NODES), required=True)
    required.add_argument("--rdzv-backend", required=True)
    required.add_argument("--rdzv-endpoint", required=True, help="host:port")
    required.add_argument("--rdzv-id", required=True, help="the rendezvous run id")
    required.add_argument(
        "--timeout",
        type=_bounded_int(1, int(contract.MAX_SECONDS)),
        required=True,
        help="seconds for the whole check, rendezvous included",
    )
    required.add_argument(
        "--threshold",
        type=_fraction,
        required=True,
        help="how far below the other nodes' median a node's figure may fall (0.25: 25 %%)",
    )
    required.add_argument("--devices", choices=contract.DEVICE_KINDS, required=True)
    required.add_argument(
        "--expected-devices", type=_bounded_int(0, contract.MAX_DEVICES), required=True
    )
    required.add_argument(
        "--report", type=Path, required=True, help="where this node's report goes"
    )
    return parser


def parse_args(argv: Sequence[str]) -> Options:
    """The options and the stage command (after `--`); exits 2 with a message when wrong."""
    arguments = list(argv)
    if contract.COMMAND_SEPARATOR in arguments:
        split = arguments.index(contract.COMMAND_SEPARATOR)
        own, command = arguments[:split], arguments[split + 1 :]
    else:
        own, command = arguments, []
    parser = _parser()
    namespace = parser.parse_args(own)  # --help answers here
    if not command:
        parser.error(f"the stage command is required after {contract.COMMAND_SEPARATOR}")
    return Options(
        nnodes=namespace.nnodes,
        rdzv_backend=namespace.rdzv_backend,
        rdzv_endpoint=namespace.rdzv_endpoint,
        rdzv_id=namespace.rdzv_id,
        timeout=namespace.timeout,
        threshold=namespace.threshold,
        devices=namespace.devices,
        expected_devices=namespace.expected_devices,
        report=namespace.report,
        command=tuple(command),
    )


# --- devices -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceState:
    found: int
    healthy: bool
    cores: int = 0  # NeuronCores: the ranks of the node's nccom-test
    problem: str = ""  # why not healthy, for the summary


def neuron_device_state(report: neuron_ls.NeuronLsReport) -> DeviceState:
    """What `neuron-ls` says about a node's devices. A device some process already holds is
    not usable: "once a NeuronCore is reserved for a process, it cannot be used by another
    process at all" until that process ends (the Neuron Runtime configuration guide), so the
    stage could not run on it; and before the stage, nothing of this pod holds a device."""
    held = sorted(device.index for device in report.devices if device.processes)
    problem = f"devices held by other processes: {held}" if held else ""
    return DeviceState(report.device_count, not held, report.core_count, problem)


def check_neuron_devices(timeout: float) -> DeviceState:
    """Run `neuron-ls` (the 2.34+ JSON option first, then the older one); a node where it is
    missing, fails or writes what the parser refuses has no usable device."""
    problems = []
    for command in (neuron_ls.OUTPUT_FORMAT_JSON_ARGV, neuron_ls.JSON_OUTPUT_ARGV):
        try:
            done = subprocess.run(
                command, capture_output=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            problems.append(f"{' '.join(command)}: {type(error).__name__}")
            continue
        if done.returncode != 0:
            problems.append(f"{' '.join(command)}: exit {done.returncode}")
            continue
        try:
            return neuron_device_state(neuron_ls.parse(done.stdout))
        except neuron_ls.NeuronLsError as error:
            problems.append(f"{' '.join(command)}: {error}")
    return DeviceState(0, False, problem="; ".join(problems))


def check_devices(kind: str, expected: int, timeout: float) -> DeviceState:
    if kind == contract.DEVICES_NEURON:
        return check_neuron_devices(min(timeout, NEURON_LS_SECONDS))
    # The CPU stand-in: the host is the node's device, as the local runner promises.
    return DeviceState(expected, True)


def nccom_test_gbps(output: str) -> float | None:
    """The "Avg bus bandwidth" of `nccom-test` output, in GB/s (nccom-test writes GiB/s, as
    its guide says); None when the output has no single such line (a failed test)."""
    found = _AVG_BUS_BANDWIDTH.findall(output)
    if len(found) != 1:
        return None
    value = float(found[0]) * GIB_IN_GB
    return value if 0 < value <= contract.MAX_GBPS else None


def neuron_throughput_gbps(cores: int, timeout: float) -> float | None:
    """The node's NeuronCores all-reducing among themselves (nccom-test on this node only).
    Not run on hardware here; None when the tool is missing or fails."""
    if cores < 1:
        return None
    command = [*NCCOM_TEST_ARGV, str(cores), "allr"]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False,
            stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return nccom_test_gbps(done.stdout) if done.returncode == 0 else None


class CpuWorkload:
    """The CPU stand-in's device workload: out = a + b over three 16 MiB tensors, which reads
    two and writes one, timed in the CPU time it took (the process's, over all its threads).
    The stand-in's device is the host's cores, which the local runner's nodes share with each
    other and with whatever else runs there: wall time would also count the waits for a core,
    the machine's load rather than the device, and judge a node by its luck with the
    scheduler. (A node that gets little CPU shows in its network figure, which wall time
    measures.)"""

    size = 3 * DEVICE_ELEMENTS * BYTES_PER_ELEMENT * DEVICE_ADDS  # bytes moved per repeat

    def __init__(self) -> None:
        import torch

        self._add = torch.add
        self._a = torch.ones(DEVICE_ELEMENTS)
        self._b = torch.ones(DEVICE_ELEMENTS)
        self._out = torch.empty(DEVICE_ELEMENTS)
        self._add(self._a, self._b, out=self._out)  # the first touch maps the pages

    def seconds(self) -> float:
        started = time.process_time()
        for _ in range(DEVICE_ADDS):
            self._add(self._a, self._b, out=self._out)
        return time.process_time() - started


# --- figures -----------------------------------------------------------------------------


def rate_gbps(size: int, seconds: float) -> float:
    return min(size / max(seconds, 1e-9) / 1e9, contract.MAX_GBPS)


def bus_gbps(size: int, seconds: float, world: int) -> float:
    """An all-reduce's bus bandwidth: its algorithm bandwidth (size / time) times 2(n-1)/n, the
    share of the data each node sends and receives in a ring, so figures compare across
    gang sizes (NCCL tests' definition, which nccom-test uses too)."""
    return rate_gbps(size, seconds) * 2 * (world - 1) / world


def ring_shifts(world: int) -> tuple[int, ...]:
    """The neighbour distances to exchange at: 1 and 2, those a gang of this size has."""
    return tuple(shift for shift in RING_SHIFTS if shift < world)


def unique_names(names: Sequence[str]) -> list[str]:
    """Node names by rank, a repeated one suffixed with its rank (the reports are keyed by
    name; two pods on one host, as in the local runner, must not share a key)."""
    seen = {name for name in names if names.count(name) == 1}
    return [name if name in seen else f"{name}#{rank}" for rank, name in enumerate(names)]


def measuring_turns(hosts: Sequence[str]) -> list[int]:
    """Each rank's turn to measure its device throughput: its place among the ranks on the
    same host. Nodes on one machine (the local runner's processes) would measure each other's
    use of its cores and memory, so they take turns; on a cluster every node is its own host
    (a pod's hostname is its own) and all measure at once, in one turn."""
    seen: dict[str, int] = {}
    turns = []
    for host in hosts:
        turns.append(seen.get(host, 0))
        seen[host] = turns[-1] + 1
    return turns


def node_name() -> str:
    return os.environ.get(workload_env.NODE_NAME) or socket.gethostname()


# --- the worker: one per node, started by the elastic agent ----------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    node: str
    devices: DeviceState
    device_kind: str
    expected_devices: int
    deadline: float  # time.monotonic() by which everything must be done
    threshold: float


def _remaining(deadline: float) -> float:
    return max(deadline - time.monotonic(), 0.1)


def gang_all_reduce_gbps(world: int) -> float | None:
    import torch
    import torch.distributed as dist

    if world < 2:
        return None
    buffer = torch.ones(GANG_ELEMENTS)
    dist.all_reduce(buffer)  # warm-up: the first call sets the algorithm's buffers up
    started = time.perf_counter()
    for _ in range(GANG_ITERATIONS):
        dist.all_reduce(buffer)
    seconds = time.perf_counter() - started
    return bus_gbps(GANG_ELEMENTS * BYTES_PER_ELEMENT * GANG_ITERATIONS, seconds, world)


def _stream(post: Callable[[], Any], deadline: float, rates: list[float]) -> None:
    """Post RING_MESSAGES messages one after the other; append the rate."""
    started = time.perf_counter()
    for _ in range(RING_MESSAGES):
        post().wait(datetime.timedelta(seconds=_remaining(deadline)))
    size = RING_ELEMENTS * BYTES_PER_ELEMENT * RING_MESSAGES
    rates.append(rate_gbps(size, time.perf_counter() - started))


def ring_gbps(rank: int, world: int, deadline: float) -> float | None:
    """The node's network figure: its best one-direction rate with a ring neighbour.

    At each shift the node sends to (rank + shift) and receives from (rank - shift), and the
    two directions are timed apart. Timed together, a node next to a slow one would look as
    slow as it: every exchange waits for its slowest side, and in a gang of three each node
    is the slow node's neighbour at both shifts. Apart, a slow node is slow in every direction
    it takes part in, while a healthy node has a direction with a healthy peer whenever two
    healthy nodes are in the gang; so the best rate singles the slow node out. (With two nodes
    there is one link, which both see alike: only their device figures can tell them apart.)"""
    import torch
    import torch.distributed as dist

    outgoing = torch.ones(RING_ELEMENTS)
    incoming = torch.empty(RING_ELEMENTS)
    rates: list[float] = []
    for shift in ring_shifts(world):
        to, source = (rank + shift) % world, (rank - shift) % world
        dist.barrier()  # every node starts the shift together
        streams = [
            threading.Thread(
                target=_stream, args=(functools.partial(dist.isend, outgoing, to), deadline, rates)
            ),
            threading.Thread(
                target=_stream,
                args=(functools.partial(dist.irecv, incoming, source), deadline, rates),
            ),
        ]
        before = len(rates)
        for stream in streams:
            stream.start()  # Work.wait releases the GIL: the two directions run together
        for stream in streams:
            stream.join(_remaining(deadline))
        if len(rates) != before + len(streams):
            raise TimeoutError(f"the ring exchange at shift {shift} did not finish")
    return max(rates) if rates else None


def device_throughput_gbps(settings: WorkerSettings, turn: int, turns: int) -> float | None:
    """The node's device figure, measured in its turn (see `measuring_turns`). On the CPU, the
    best of DEVICE_REPEATS repeats, the turns interleaved repeat by repeat: nodes sharing a
    machine then sample its other load over the same stretch of time, not one node a quiet
    moment and the next a busy one."""
    import torch.distributed as dist

    if settings.device_kind == contract.DEVICES_NEURON:
        figure = None
        for current in range(turns):
            if current == turn:
                figure = neuron_throughput_gbps(
                    settings.devices.cores, min(_remaining(settings.deadline), NCCOM_TEST_SECONDS)
                )
            dist.barrier()
        return figure
    workload = CpuWorkload()
    best = math.inf
    for _ in range(DEVICE_REPEATS):
        for current in range(turns):
            if current == turn:
                best = min(best, workload.seconds())
            if turns > 1:
                dist.barrier()
    return rate_gbps(workload.size, best)


def measure(
    settings: WorkerSettings, rank: int, world: int, turns: list[int]
) -> contract.NodeReport:
    """One round of this node's figures (every node of the gang runs it together)."""
    gang = gang_all_reduce_gbps(world)
    device = device_throughput_gbps(settings, turns[rank], max(turns) + 1)
    network = ring_gbps(rank, world, settings.deadline)
    return contract.NodeReport(
        outcome=contract.PASSED,  # the launching process sets what the node did
        seconds=0.0,
        devices_expected=settings.expected_devices,
        devices_found=settings.devices.found,
        devices_healthy=settings.devices.healthy,
        device_gbps=device,
        network_gbps=network,
        gang_gbps=gang,
    )


def _best(first: float | None, second: float | None) -> float | None:
    present = [value for value in (first, second) if value is not None]
    return max(present) if present else None


def best_of(first: contract.NodeReport, second: contract.NodeReport) -> contract.NodeReport:
    """A node's report with each figure the best of its two rounds."""
    return dataclasses.replace(
        first,
        device_gbps=_best(first.device_gbps, second.device_gbps),
        network_gbps=_best(first.network_gbps, second.network_gbps),
        gang_gbps=_best(first.gang_gbps, second.gang_gbps),
    )


def reports_by_name(names: Sequence[str], texts: Sequence[str]) -> dict[str, contract.NodeReport]:
    """The gathered reports, keyed by node name (repeated names told apart by rank)."""
    return {
        name: contract.parse_report(text)
        for name, text in zip(unique_names(names), texts, strict=True)
    }


def needs_confirming(gathered: Sequence[tuple[str, str]], threshold: float) -> bool:
    """Whether a figure judges a node unfit: such a verdict is measured once more before it
    stands. A moment's contention (another process on the host, a scheduler hiccup) slows one
    round; a slow device or link is slow in both. A node missing devices needs no second look."""
    reports = reports_by_name([name for name, _ in gathered], [text for _, text in gathered])
    return any(
        verdict.reason != contract.REASON_DEVICES for verdict in contract.judge(reports, threshold)
    )


def _gather(node: str, report: contract.NodeReport, world: int) -> list[tuple[str, str]]:
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (node, report.to_json()))
    return [(str(name), str(text)) for name, text in gathered]


def run_worker(settings: WorkerSettings) -> str:
    """One node's checks in the gang (the elastic agent's worker); returns the gathered
    reports as JSON: {"rank": its rank, "names": [node by rank], "reports": [report by rank]}.
    Every node gathers the same reports, so all decide alike whether to confirm a verdict."""
    import torch.distributed as dist

    # The last bound: should the launching process die, its worker still ends.
    signal.alarm(math.ceil(_remaining(settings.deadline)) + 5)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    print(
        f"preflight: {settings.node} joined the gang as rank {rank} of {world}",
        file=sys.stderr,
        flush=True,
    )
    dist.init_process_group(
        "gloo", timeout=datetime.timedelta(seconds=_remaining(settings.deadline))
    )
    try:
        hosts: list[Any] = [None] * world
        dist.all_gather_object(hosts, socket.gethostname())
        turns = measuring_turns([str(host) for host in hosts])
        report = measure(settings, rank, world, turns)
        gathered = _gather(settings.node, report, world)
        if needs_confirming(gathered, settings.threshold):
            print("preflight: a node looks slow; measuring once more", file=sys.stderr, flush=True)
            report = best_of(report, measure(settings, rank, world, turns))
            gathered = _gather(settings.node, report, world)
    finally:
        dist.destroy_process_group()
    return json.dumps(
        {
            "rank": rank,
            "names": [name for name, _ in gathered],
            "reports": [text for _, text in gathered],
        }
    )


# --- the launching process ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GangResult:
    own: contract.NodeReport  # with the outcome this node acts on
    reports: Mapping[str, contract.NodeReport]
    verdicts: list[contract.NodeVerdict]


def judge_gang(worker_output: str, threshold: float, seconds: float) -> GangResult:
    """The gang's verdict from the worker's gathered reports, and this node's own report."""
    body = json.loads(worker_output)
    own_rank = int(body["rank"])
    reports = reports_by_name([str(name) for name in body["names"]], body["reports"])
    verdicts = contract.judge(reports, threshold)
    own = dataclasses.replace(
        reports[list(reports)[own_rank]],  # keyed in rank order
        outcome=contract.UNFIT if verdicts else contract.PASSED,
        seconds=min(seconds, contract.MAX_SECONDS),
    )
    return GangResult(own, reports, verdicts)


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g} GB/s"


def _median(values: Sequence[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return statistics.median(present) if present else None


def summary(node: str, result: GangResult) -> list[str]:
    """A few lines for a person reading the pod's log: the gang's figures and the unfit."""
    reports = list(result.reports.values())
    own = result.own
    lines = [
        f"preflight: {len(reports)} nodes; medians: device "
        f"{_figure(_median([r.device_gbps for r in reports]))}, network "
        f"{_figure(_median([r.network_gbps for r in reports]))}, gang all-reduce "
        f"{_figure(_median([r.gang_gbps for r in reports]))}",
        f"preflight: this node ({node}): {own.devices_found} of {own.devices_expected} devices"
        f"{'' if own.devices_healthy else ' (not all usable)'}, device "
        f"{_figure(own.device_gbps)}, network {_figure(own.network_gbps)}",
    ]
    lines += [f"preflight: unfit: {v.node}: {v.reason}: {v.detail}" for v in result.verdicts]
    verdict = f"the gang is unfit (exit {contract.EXIT_UNFIT})" if result.verdicts else "passed"
    lines.append(f"preflight: {verdict}")
    return lines


def write_report(path: Path, report: contract.NodeReport) -> None:
    try:
        path.write_text(report.to_json())
    except OSError as error:
        print(f"preflight: cannot write the report to {path}: {error}", file=sys.stderr)


def _children() -> list[int]:
    """This process's children (the agent's worker, a running tool), from /proc."""
    pids: list[int] = []
    for task in Path("/proc/self/task").glob("*/children"):
        try:
            pids += [int(pid) for pid in task.read_text().split()]
        except OSError:
            continue
    return pids


class Finish:
    """The one way this process ends: the check's result, or the watchdog's timeout, whichever
    comes first (a lock keeps the other from writing a second report)."""

    def __init__(self, options: Options, devices: DeviceState, started: float) -> None:
        self.options = options
        self.devices = devices
        self.started = started
        self._lock = threading.Lock()
        self._claimed = False
        self._watchdog = threading.Timer(options.timeout, self.timed_out)
        self._watchdog.daemon = True

    def start(self) -> None:
        self._watchdog.start()

    def claim(self) -> bool:
        with self._lock:
            if self._claimed:
                return False
            self._claimed = True
            return True

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def timed_out(self, why: str = "") -> None:
        if not self.claim():
            return
        report = contract.NodeReport(
            outcome=contract.TIMEOUT,
            seconds=min(self.elapsed(), contract.MAX_SECONDS),
            devices_expected=self.options.expected_devices,
            devices_found=self.devices.found,
            devices_healthy=self.devices.healthy,
        )
        write_report(self.options.report, report)
        print(
            f"preflight: the gang's check did not finish within {self.options.timeout} s "
            f"({why or 'a node never joined, or the check hung'}); exit {contract.EXIT_TIMEOUT}",
            file=sys.stderr,
            flush=True,
        )
        for pid in _children():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
        os._exit(contract.EXIT_TIMEOUT)


def launch(options: Options, settings: WorkerSettings) -> str:
    """Join the gang with torch's elastic agent (torchrun's rendezvous) and run the worker on
    this node; returns the worker's output."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    seconds = max(int(_remaining(settings.deadline)), 1)
    config = LaunchConfig(
        min_nodes=options.nnodes,
        max_nodes=options.nnodes,
        nproc_per_node=1,
        run_id=options.rdzv_id,
        role="preflight",
        rdzv_backend=options.rdzv_backend,
        rdzv_endpoint=options.rdzv_endpoint,
        rdzv_configs={
            "timeout": seconds,  # etcd backends
            "join_timeout": seconds,
            "read_timeout": seconds,  # the c10d backend's store
            "close_timeout": min(seconds, 10),
        },
        max_restarts=0,
        monitor_interval=0.05,
        # fork: the worker starts with this process's torch already imported (spawn would
        # import it again: seconds on every node). This process has run no torch op, and the
        # worker builds its own process group and store client.
        start_method="fork",
    )
    outputs: dict[int, Any] = elastic_launch(config, run_worker)(settings)
    (output,) = outputs.values()
    return str(output)


def _is_signal(error: Exception) -> bool:
    """The elastic agent turns SIGTERM and the like into SignalException."""
    api = sys.modules.get("torch.distributed.elastic.multiprocessing.api")
    return api is not None and isinstance(error, api.SignalException)


def exec_stage(command: Sequence[str]) -> NoReturn:
    """Replace this process with the stage: it keeps the PID (the container's main process)
    and gets its signals. Only stdio is passed on (the rendezvous store's sockets are not)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.closerange(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    try:
        os.execvp(command[0], list(command))
    except OSError as error:
        print(f"preflight: cannot run the stage command {command[0]!r}: {error}", file=sys.stderr)
        os._exit(127)


def _wait_for_the_watchdog() -> NoReturn:
    """The watchdog claimed the outcome first: it writes the report and ends the process."""
    while True:
        time.sleep(60)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    deadline = started + options.timeout
    node = node_name()
    finish = Finish(options, DeviceState(0, False, problem="not checked yet"), started)
    finish.start()
    devices = check_devices(options.devices, options.expected_devices, options.timeout)
    finish.devices = devices
    if devices.problem:
        print(f"preflight: devices: {devices.problem}", file=sys.stderr, flush=True)
    settings = WorkerSettings(
        node, devices, options.devices, options.expected_devices, deadline, options.threshold
    )
    try:
        output = launch(options, settings)
        result = judge_gang(output, options.threshold, finish.elapsed())
    except Exception as error:  # the gang's check failed: a node left it, or a worker failed
        if _is_signal(error):
            raise  # the pod is being stopped: no verdict
        first_line = (str(error).strip().splitlines() or [""])[0][:200]
        finish.timed_out(f"{type(error).__name__}: {first_line}")
        _wait_for_the_watchdog()  # timed_out returns only when the watchdog came first
    if not finish.claim():
        _wait_for_the_watchdog()
    write_report(options.report, result.own)
    for line in summary(node, result):
        print(line, file=sys.stderr)
    time.sleep(LINGER_SECONDS)
    if result.verdicts:
        # Nothing is left to clean up (the worker is gone, the report written): skip the
        # interpreter's teardown of torch and the agent's threads (most of a second).
        sys.stderr.flush()
        os._exit(contract.EXIT_UNFIT)
    exec_stage(options.command)


if __name__ == "__main__":
    main()

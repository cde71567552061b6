"""The gang preflight (trainium_training.preflight) as pods run it: one process per node, each
with its own node name, meeting through a local c10d rendezvous on the CPU, with the command
the contract writes (`contract.preflight.argv`); and its pure parts."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from support.throttle import process_tree
from training.training_helpers import TRAINING_ROOT, child_env
from trainium_operator.contract import neuron_ls
from trainium_operator.contract import preflight as contract
from trainium_training import preflight

pytestmark = pytest.mark.training

REPO = Path(__file__).resolve().parents[2]
NEURON_LS_FIXTURE = REPO / "tests" / "unit" / "fixtures" / "neuron_ls" / "trn1-json-output.json"
THRESHOLD = 0.25
CHECK_TIMEOUT_S = 60  # the healthy and throttled gangs finish in seconds
EXIT_WAIT_S = 90
# The stage command: writes its PID and open file descriptors to the file named, so a test
# sees that it ran, as what, and with what.
STAGE = (
    "import json, os, pathlib, sys; "
    "pathlib.Path(sys.argv[1]).write_text("
    "json.dumps({'pid': os.getpid(), 'fds': sorted(map(int, os.listdir('/proc/self/fd')))}))"
)

# nccom-test's output, as its user guide shows it (tools/neuron-sys-tools/nccom-test.rst).
NCCOM_TEST_OUTPUT = """\
     size(B)    count(elems)     type    time(us)    algbw(GB/s)    busbw(GB/s)
    33554432        33554432    uint8         768          40.69          40.69
Avg bus bandwidth:      40.6901GB/s
"""
NCCOM_TEST_SWEEP_OUTPUT = """\
       size(B)    count(elems)    type    time(us)    algbw(GB/s)    busbw(GB/s)
          1024             256    fp32          58           0.02           0.02
    1073741824       268435456    fp32       18930          52.83          52.83
Avg bus bandwidth:      23.6671GB/s
"""
NCCOM_TEST_FAILED_OUTPUT = """\
     size(B)    count(elems)    type    time(us)    algbw(GB/s)    busbw(GB/s)
    33554432    Failure running neuron-bench - log file /tmp/nccom_test_log_7pqpdfjf.log
1 errors found - test failed
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Node:
    """One pod's preflight process, its stderr collected line by line as it comes."""

    name: str
    process: subprocess.Popen[str]
    report: Path
    marker: Path
    started: float
    lines: list[str] = field(default_factory=list)
    joined: threading.Event = field(default_factory=threading.Event)
    judged: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None

    def start_reading(self) -> None:
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            if "joined the gang" in line:
                self.joined.set()
            if line.startswith(("preflight: passed", "preflight: the gang is unfit")):
                self.judged.set()

    def wait(self) -> int:
        """The exit code, once the process ended and all its stderr was read."""
        code = self.process.wait(timeout=EXIT_WAIT_S)
        if self.reader is not None:
            self.reader.join(EXIT_WAIT_S)
        return code

    def stderr(self) -> str:
        return "".join(self.lines)

    def parsed_report(self) -> contract.NodeReport:
        return contract.parse_report(self.report.read_text())


def preflight_command(*, nodes: int, port: int, timeout: int, report: Path) -> list[str]:
    """The contract's command for a CPU node, with this interpreter and a report file."""
    command = contract.argv(
        nodes=nodes,
        rdzv_backend="c10d",
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_id="preflight-test",
        timeout_seconds=timeout,
        threshold=THRESHOLD,
        devices=contract.DEVICES_CPU,
        expected_devices=1,
    )
    assert command[:3] == ["python3", "-m", contract.MODULE]
    assert command[-1] == f"--report={contract.TERMINATION_MESSAGE_PATH}"
    return [sys.executable, *command[1:-1], f"--report={report}"]


def preflight_env(**overrides: str) -> dict[str, str]:
    env = child_env(**overrides)
    env["PYTHONPATH"] = os.pathsep.join([str(TRAINING_ROOT), env["PYTHONPATH"]])
    return env


def start_node(tmp_path: Path, name: str, port: int, *, nodes: int, timeout: int) -> Node:
    report = tmp_path / f"{name}.report"
    marker = tmp_path / f"{name}.stage-ran"
    command = preflight_command(nodes=nodes, port=port, timeout=timeout, report=report)
    process = subprocess.Popen(
        [*command, contract.COMMAND_SEPARATOR, sys.executable, "-c", STAGE, str(marker)],
        env=preflight_env(TRAINIUM_NODE_NAME=name),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    node = Node(name, process, report, marker, time.monotonic())
    node.start_reading()
    return node


@pytest.fixture
def gang(tmp_path: Path) -> Iterator[list[Node]]:
    """The nodes a test starts; any still running at its end are killed."""
    nodes: list[Node] = []
    yield nodes
    for node in nodes:
        if node.process.poll() is None:
            for pid in process_tree(node.process.pid):  # the preflight and its worker
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            node.process.wait()


@pytest.mark.integration  # a real gang of processes
def test_a_healthy_gang_passes_and_every_node_execs_its_stage_command(
    tmp_path: Path, gang: list[Node]
) -> None:
    """Two nodes: every node imports torch, and a test's nodes share this machine's cores. (A
    throttled node is found end to end in tests/integration/test_preflight.py.)"""
    port = free_port()
    gang += [
        start_node(tmp_path, f"node-{i}", port, nodes=2, timeout=CHECK_TIMEOUT_S) for i in range(2)
    ]
    for node in gang:
        assert node.wait() == 0, node.stderr()
    for node in gang:
        # exec: the stage ran as the preflight's own process (same PID), with stdio only (and
        # the descriptor listing its own descriptors): no rendezvous socket leaked into it.
        stage = json.loads(node.marker.read_text())
        assert stage["pid"] == node.process.pid, node.stderr()
        assert stage["fds"] == [0, 1, 2, 3], stage
        report = node.parsed_report()
        assert report.outcome == contract.PASSED
        assert (report.devices_found, report.devices_expected) == (1, 1)
        assert report.devices_healthy
        assert report.device_gbps
        assert report.network_gbps
        assert report.gang_gbps
        assert "preflight: passed" in node.stderr()
    reports = {node.name: node.parsed_report() for node in gang}
    assert contract.judge(reports, THRESHOLD) == []


@pytest.mark.integration  # a real gang of processes
def test_a_node_that_never_joins_times_the_others_out(tmp_path: Path, gang: list[Node]) -> None:
    """Two of three nodes start; the third never does. Each of the two ends at its timeout,
    which counts from its start (rendezvous included), with a timeout report."""
    timeout = 4
    port = free_port()
    gang += [start_node(tmp_path, f"node-{i}", port, nodes=3, timeout=timeout) for i in range(2)]
    for node in gang:
        assert node.wait() == contract.EXIT_TIMEOUT, node.stderr()
        assert time.monotonic() - node.started < timeout + 3
        report = node.parsed_report()
        assert report.outcome == contract.TIMEOUT
        assert (report.devices_found, report.devices_healthy) == (1, True)  # checked first
        assert report.device_gbps is None
        assert report.network_gbps is None
        assert not node.marker.exists()
        assert f"did not finish within {timeout} s" in node.stderr()


@pytest.mark.parametrize("tail", [[], [contract.COMMAND_SEPARATOR]])
def test_the_preflight_refuses_a_command_line_without_a_stage_command(
    tail: list[str], tmp_path: Path
) -> None:
    command = preflight_command(nodes=2, port=1, timeout=5, report=tmp_path / "report")
    result = subprocess.run(
        [*command, *tail],
        env=preflight_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "the stage command is required after --" in result.stderr
    assert not (tmp_path / "report").exists()


# --- pure parts ------------------------------------------------------------------------------


def test_parse_args_reads_the_contracts_command_and_the_stage_command() -> None:
    argv = contract.argv(
        nodes=4,
        rdzv_backend="c10d",
        rdzv_endpoint="job-0.job:29400",
        rdzv_id="job-preflight-1",
        timeout_seconds=300,
        threshold=0.25,
        devices=contract.DEVICES_NEURON,
        expected_devices=16,
    )
    options = preflight.parse_args([*argv[3:], "--", "torchrun", "--nnodes=4", "--", "x"])
    assert options == preflight.Options(
        nnodes=4,
        rdzv_backend="c10d",
        rdzv_endpoint="job-0.job:29400",
        rdzv_id="job-preflight-1",
        timeout=300,
        threshold=0.25,
        devices=contract.DEVICES_NEURON,
        expected_devices=16,
        report=Path(contract.TERMINATION_MESSAGE_PATH),
        command=("torchrun", "--nnodes=4", "--", "x"),
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--threshold", "1"), ("--nnodes", "0"), ("--devices", "gpu"), ("--timeout", "0")],
)
def test_parse_args_refuses_values_out_of_bounds(flag: str, value: str) -> None:
    argv = contract.argv(
        nodes=2,
        rdzv_backend="c10d",
        rdzv_endpoint="h:1",
        rdzv_id="x",
        timeout_seconds=5,
        threshold=0.25,
        devices=contract.DEVICES_CPU,
        expected_devices=1,
    )
    argv = [a for a in argv[3:] if not a.startswith(f"{flag}=")] + [f"{flag}={value}"]
    with pytest.raises(SystemExit) as exit_info:
        preflight.parse_args([*argv, "--", "true"])
    assert exit_info.value.code == 2


def test_nccom_test_output_gives_its_average_bus_bandwidth_in_gigabytes_per_second() -> None:
    # nccom-test writes GiB/s (its guide's column description); the report holds GB/s.
    assert preflight.nccom_test_gbps(NCCOM_TEST_OUTPUT) == pytest.approx(40.6901 * 1.073741824)
    assert preflight.nccom_test_gbps(NCCOM_TEST_SWEEP_OUTPUT) == pytest.approx(
        23.6671 * 1.073741824
    )


@pytest.mark.parametrize(
    "output",
    [
        NCCOM_TEST_FAILED_OUTPUT,
        "Neuron DKMS Driver is not running!\n",
        "",
        NCCOM_TEST_OUTPUT + NCCOM_TEST_OUTPUT,  # two figures: not one test's output
        "Avg bus bandwidth:      nanGB/s\n",
    ],
)
def test_nccom_test_output_without_one_average_gives_no_figure(output: str) -> None:
    assert preflight.nccom_test_gbps(output) is None


def test_a_neuron_device_another_process_holds_is_not_healthy() -> None:
    devices = json.loads(NEURON_LS_FIXTURE.read_text())
    free = preflight.neuron_device_state(neuron_ls.parse(json.dumps(devices)))
    assert (free.found, free.healthy, free.cores) == (16, True, 32)
    devices[3]["neuron_processes"] = [{"pid": 4242, "command": "python3 train.py"}]
    held = preflight.neuron_device_state(neuron_ls.parse(json.dumps(devices)))
    assert (held.found, held.healthy) == (16, False)
    assert "[3]" in held.problem


def test_a_node_without_neuron_ls_has_no_usable_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    state = preflight.check_devices(contract.DEVICES_NEURON, 16, timeout=10)
    assert (state.found, state.healthy) == (0, False)
    assert "neuron-ls" in state.problem


def test_the_cpu_stand_in_finds_the_expected_devices() -> None:
    assert preflight.check_devices(contract.DEVICES_CPU, 1, timeout=10) == preflight.DeviceState(
        1, True
    )


def test_bus_bandwidth_scales_the_algorithm_bandwidth_by_2_n_minus_1_over_n() -> None:
    assert preflight.bus_gbps(4_000_000_000, 2.0, 4) == pytest.approx(2.0 * 2 * 3 / 4)
    assert preflight.bus_gbps(1_000_000_000, 1.0, 2) == pytest.approx(1.0)


def test_ring_shifts_are_the_distinct_neighbour_distances_a_gang_has() -> None:
    assert preflight.ring_shifts(1) == ()
    assert preflight.ring_shifts(2) == (1,)
    assert preflight.ring_shifts(3) == (1, 2)
    assert preflight.ring_shifts(64) == (1, 2)


def test_nodes_sharing_a_host_measure_in_turns_and_separate_hosts_at_once() -> None:
    assert preflight.measuring_turns(["a", "b", "c"]) == [0, 0, 0]
    assert preflight.measuring_turns(["h", "h", "g", "h"]) == [0, 1, 0, 2]


def test_repeated_node_names_are_told_apart_by_rank() -> None:
    assert preflight.unique_names(["a", "b", "a"]) == ["a#0", "b", "a#2"]


def report(device: float, network: float) -> str:
    return contract.NodeReport(
        outcome=contract.PASSED,
        seconds=0.0,
        devices_expected=1,
        devices_found=1,
        devices_healthy=True,
        device_gbps=device,
        network_gbps=network,
        gang_gbps=1.0,
    ).to_json()


def gathered(rank: int, figures: list[tuple[float, float]]) -> str:
    return json.dumps(
        {
            "rank": rank,
            "names": [f"node-{i}" for i in range(len(figures))],
            "reports": [report(*pair) for pair in figures],
        }
    )


def test_each_node_writes_its_own_report_with_the_gangs_outcome() -> None:
    figures = [(20.0, 1.0), (5.0, 1.0), (21.0, 1.1)]
    result = preflight.judge_gang(gathered(0, figures), THRESHOLD, seconds=3.25)
    assert [v.node for v in result.verdicts] == ["node-1"]
    assert result.own.outcome == contract.UNFIT  # node-0 itself is fit; its gang is not
    written = contract.parse_report(result.own.to_json())
    assert (written.seconds, written.device_gbps, written.network_gbps) == (3.25, 20.0, 1.0)
    lines = preflight.summary("node-0", result)
    assert any(line.startswith("preflight: unfit: node-1: DeviceThroughput") for line in lines)
    passed = preflight.judge_gang(gathered(1, [(20.0, 1.0), (21.0, 1.1)]), THRESHOLD, seconds=1.0)
    assert passed.verdicts == []
    assert (passed.own.outcome, passed.own.device_gbps) == (contract.PASSED, 21.0)


def test_the_report_file_holds_the_nodes_report(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    path.write_text("older text, longer than the report that replaces it" * 40)
    own = contract.parse_report(report(20.0, 1.0))
    preflight.write_report(path, own)
    assert contract.parse_report(path.read_text()) == own


def gathered_pairs(figures: list[tuple[float, float]]) -> list[tuple[str, str]]:
    return [(f"node-{i}", report(*pair)) for i, pair in enumerate(figures)]


def test_a_figure_that_finds_a_node_slow_is_measured_again_before_it_stands() -> None:
    assert preflight.needs_confirming(gathered_pairs([(20.0, 1.0), (5.0, 1.0), (21.0, 1.1)]), 0.25)
    assert preflight.needs_confirming(gathered_pairs([(20.0, 1.0), (20.0, 0.1), (21.0, 1.1)]), 0.25)
    assert not preflight.needs_confirming(
        gathered_pairs([(20.0, 1.0), (19.0, 0.9), (21.0, 1.1)]), 0.25
    )


def test_a_node_missing_devices_is_not_measured_again() -> None:
    missing = contract.NodeReport(
        outcome=contract.PASSED,
        seconds=0.0,
        devices_expected=16,
        devices_found=15,
        devices_healthy=True,
        device_gbps=20.0,
        network_gbps=1.0,
    ).to_json()
    pairs = [*gathered_pairs([(20.0, 1.0), (21.0, 1.0)]), ("node-2", missing)]
    assert not preflight.needs_confirming(pairs, 0.25)


def test_a_confirmed_nodes_figures_are_the_best_of_its_two_rounds() -> None:
    first = contract.parse_report(report(5.0, 1.0))
    second = dataclasses.replace(
        contract.parse_report(report(20.0, 0.5)), gang_gbps=None, outcome=contract.UNFIT
    )
    best = preflight.best_of(first, second)
    assert (best.device_gbps, best.network_gbps, best.gang_gbps) == (20.0, 1.0, 1.0)
    assert best.outcome == contract.PASSED  # the first round's, which the launcher then sets

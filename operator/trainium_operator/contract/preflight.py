"""The gang preflight's contract: how a pod runs it, what each node reports, and the one rule
that judges a node against its gang. One module both sides import: the pod builder writes the
command (`argv`), the training image's `trainium_training.preflight` runs it and writes its
node's report, the operator reads the reports back (`parse_report`) and judges them (`judge`).

What runs: before a gang's stage command, each pod runs one preflight process (the stage command
follows it in the same container: `argv(...) + ["--", *stage command]`, and the preflight
process `exec`s it once the gang passed). The processes meet through the same rendezvous as
the stage's torchrun (its own run id), so they check exactly the nodes the gang was placed on:
1. each node's devices: the count and state its instance type promises (`neuron-ls`, parsed by
   `contract/neuron_ls.py`; on CPU, the local runner's stand-in, the host itself);
2. each node's device throughput (on CPU: a fixed tensor workload), in GB/s;
3. a short all-reduce across the whole gang (gloo over the pod network), which proves every
   node reaches every other; then each node exchanges a fixed buffer with its ring neighbours
   (two shifts), and its best rate is its network figure, in GB/s.
Each node's figures are judged against the median of the *other* nodes' (AWS publishes no
absolute figure to hold a node to). Every node gathers every report and applies `judge`: if
any node is unfit, every node exits `EXIT_UNFIT` and nothing trains; each writes its *own*
report to its termination message. The operator judges again from those messages, each read
from the pod (so the node) that wrote it: one node's pod cannot speak for another's.

Bounds: a report is at most MAX_REPORT_BYTES of JSON with known keys and finite numbers; the
operator never echoes a report's text, only numbers it parsed.

Standard library only: the training image imports this module without our dependencies.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MODULE = "trainium_training.preflight"  # python3 -m <MODULE> in the training image
# The gang is unfit: a node's devices or figures are below the bound. Nothing trained.
EXIT_UNFIT = 86
# The gang check did not finish within its timeout (a node that never joined, a hang).
EXIT_TIMEOUT = 87
EXIT_CODES = frozenset({EXIT_UNFIT, EXIT_TIMEOUT})
# Kubernetes' default terminationMessagePath (the kubelet keeps at most 4096 bytes).
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
REPORT_KIND = "trainium.dev/preflight"
REPORT_VERSION = 1
MAX_REPORT_BYTES = 1024
MAX_GBPS = 1e6  # a figure above this is not a measurement
MAX_SECONDS = 86400.0
MAX_DEVICES = 4096
# The command's separator: what follows is the stage command, run once the gang passed.
COMMAND_SEPARATOR = "--"

# Device checks: which devices a node must show (the operator picks; the local CPU runner
# swaps `neuron` for `cpu`, as it swaps the pod's paths).
DEVICES_NEURON = "neuron"
DEVICES_CPU = "cpu"
DEVICE_KINDS = (DEVICES_NEURON, DEVICES_CPU)

# Outcomes a node reports for itself.
PASSED = "passed"
UNFIT = "unfit"
TIMEOUT = "timeout"
OUTCOMES = (PASSED, UNFIT, TIMEOUT)

# Why a node is judged unfit (NodeVerdict.reason): operator-worded, never the pod's text.
REASON_DEVICES = "Devices"
REASON_DEVICE_THROUGHPUT = "DeviceThroughput"
REASON_NETWORK = "NetworkBandwidth"


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node's preflight, as its own process measured it."""

    outcome: str  # PASSED | UNFIT | TIMEOUT
    seconds: float  # how long the preflight ran on this node
    devices_expected: int
    devices_found: int
    devices_healthy: bool  # every device found is in a usable state
    device_gbps: float | None = None  # the node's device throughput
    network_gbps: float | None = None  # its best ring-neighbour exchange rate
    gang_gbps: float | None = None  # the whole gang's all-reduce bus bandwidth, seen from here

    def to_json(self) -> str:
        body: dict[str, object] = {
            "kind": REPORT_KIND,
            "version": REPORT_VERSION,
            "outcome": self.outcome,
            "seconds": round(self.seconds, 3),
            "devicesExpected": self.devices_expected,
            "devicesFound": self.devices_found,
            "devicesHealthy": self.devices_healthy,
        }
        for key, value in (
            ("deviceGBps", self.device_gbps),
            ("networkGBps", self.network_gbps),
            ("gangGBps", self.gang_gbps),
        ):
            if value is not None:
                body[key] = round(value, 4)
        return json.dumps(body, separators=(",", ":"))


def _number(body: Mapping[str, object], key: str, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ValueError(f"{key}: a number is required")
    if not math.isfinite(value) or not 0 <= value <= high:
        raise ValueError(f"{key}: a number in 0..{high:g} is required")
    return float(value)


def _count(body: Mapping[str, object], key: str) -> int:
    value = body.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_DEVICES:
        raise ValueError(f"{key}: an integer in 0..{MAX_DEVICES} is required")
    return value


def parse_report(raw: str | bytes | None) -> NodeReport:
    """A node's report from its termination message; ValueError says what is wrong (the
    message is the pod's own text: nothing of it is believed beyond its shape)."""
    if raw is None:
        raise ValueError("no report")
    data = raw.encode() if isinstance(raw, str) else raw
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"the report is larger than {MAX_REPORT_BYTES} bytes")
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError("the report is not JSON") from error
    if not isinstance(body, dict) or body.get("kind") != REPORT_KIND:
        raise ValueError(f"not a {REPORT_KIND} report")
    if body.get("version") != REPORT_VERSION:
        raise ValueError(f"report version {REPORT_VERSION} is required")
    outcome = body.get("outcome")
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome: one of {', '.join(OUTCOMES)} is required")
    healthy = body.get("devicesHealthy")
    if not isinstance(healthy, bool):
        raise ValueError("devicesHealthy: a boolean is required")
    seconds = _number(body, "seconds", MAX_SECONDS)
    if seconds is None:
        raise ValueError("seconds: a number is required")
    return NodeReport(
        outcome=str(outcome),
        seconds=seconds,
        devices_expected=_count(body, "devicesExpected"),
        devices_found=_count(body, "devicesFound"),
        devices_healthy=healthy,
        device_gbps=_number(body, "deviceGBps", MAX_GBPS),
        network_gbps=_number(body, "networkGBps", MAX_GBPS),
        gang_gbps=_number(body, "gangGBps", MAX_GBPS),
    )


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """A node judged unfit: why, in the operator's words, and by how much."""

    node: str
    reason: str  # REASON_*
    detail: str  # built from parsed numbers only
    ratio: float | None = None  # the node's figure over the other nodes' median


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def _slow(
    figures: Mapping[str, float], threshold: float, reason: str, what: str
) -> list[NodeVerdict]:
    """Nodes whose figure is below (1 - threshold) x the median of the other nodes' figures.
    O(n^2 log n) is fine: a gang has at most a few hundred nodes and this runs once per gang."""
    if len(figures) < 2:
        return []
    found = []
    for node, own in figures.items():
        others = _median([value for name, value in figures.items() if name != node])
        if others > 0 and own < (1 - threshold) * others:
            ratio = round(own / others, 3)
            found.append(
                NodeVerdict(
                    node,
                    reason,
                    f"{what} {own:.3g} GB/s, {ratio:.2f}x the other nodes' median "
                    f"({others:.3g} GB/s)",
                    ratio,
                )
            )
    return found


def judge(reports: Mapping[str, NodeReport], threshold: float) -> list[NodeVerdict]:
    """The unfit nodes of one gang, by node name (one entry per node, its first reason: devices,
    then device throughput, then network), in name order. `threshold` is the fraction below the
    others' median a node may fall (0.25: a node at under 75 % of the median is unfit)."""
    if not 0 < threshold < 1:
        raise ValueError("threshold must be between 0 and 1")
    verdicts: dict[str, NodeVerdict] = {}
    for node, report in reports.items():
        if report.devices_found < report.devices_expected or not report.devices_healthy:
            state = "" if report.devices_healthy else ", not all in a usable state"
            verdicts[node] = NodeVerdict(
                node,
                REASON_DEVICES,
                f"{report.devices_found} of {report.devices_expected} devices found{state}",
            )
    for reason, what, attribute in (
        (REASON_DEVICE_THROUGHPUT, "device throughput", "device_gbps"),
        (REASON_NETWORK, "network bandwidth", "network_gbps"),
    ):
        figures = {
            node: value
            for node, report in reports.items()
            if (value := getattr(report, attribute)) is not None
        }
        for verdict in _slow(figures, threshold, reason, what):
            verdicts.setdefault(verdict.node, verdict)
    return [verdicts[node] for node in sorted(verdicts)]


def argv(
    *,
    nodes: int,
    rdzv_backend: str,
    rdzv_endpoint: str,
    rdzv_id: str,
    timeout_seconds: int,
    threshold: float,
    devices: str,
    expected_devices: int,
) -> list[str]:
    """The preflight's argv, before COMMAND_SEPARATOR and the stage command. Every value is
    the operator's (the spec's bounded numbers, the instance type's device count)."""
    return [
        "python3",
        "-m",
        MODULE,
        f"--nnodes={nodes}",
        f"--rdzv-backend={rdzv_backend}",
        f"--rdzv-endpoint={rdzv_endpoint}",
        f"--rdzv-id={rdzv_id}",
        f"--timeout={timeout_seconds}",
        f"--threshold={threshold:g}",
        f"--devices={devices}",
        f"--expected-devices={expected_devices}",
        f"--report={TERMINATION_MESSAGE_PATH}",
    ]

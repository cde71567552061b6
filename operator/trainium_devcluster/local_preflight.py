"""A preflighted gang's check run on this machine, as the demo runs the pods' commands: KWOK
pods run no code, so each pod's own preflight command runs here as a real process (on CPU, one
per pod, meeting through a local rendezvous), and its exit code and report become the pod's
end, as the kubelet would report them (exit code, termination message).

The pod's argv is kept but for what cannot be the same here: the interpreter, the rendezvous
endpoint (the pod's DNS name does not resolve outside the cluster), the devices (`cpu`: the
host stands in for the node's Neuron devices), the report path, and the stage command after
the separator (a no-op: the demo runs the stage's command its own way once the gang passed).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainium_devcluster import sim
from trainium_operator.contract import preflight as contract

# Where the training image's package (trainium_training) lives in a checkout.
TRAINING_ROOT = Path(__file__).resolve().parents[2] / "images" / "training"


@dataclass
class LocalPreflight:
    """One pod's preflight process."""

    pod: str
    node: str
    process: subprocess.Popen[bytes]
    report: Path
    log: Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def local_argv(command: list[str], *, endpoint: str, report: Path) -> list[str] | None:
    """The pod's preflight command for a run on this machine; None: the pod has none."""
    if command[:3] != ["python3", "-m", contract.MODULE]:
        return None
    split = command.index(contract.COMMAND_SEPARATOR)
    replaced = {
        "--rdzv-endpoint": endpoint,
        "--devices": contract.DEVICES_CPU,
        "--report": str(report),
    }
    args = []
    for arg in command[3:split]:
        name = arg.split("=", 1)[0]
        args.append(f"{name}={replaced[name]}" if name in replaced else arg)
    no_op = [sys.executable, "-c", "pass"]
    return [sys.executable, "-m", contract.MODULE, *args, contract.COMMAND_SEPARATOR, *no_op]


def start(gang: list[Any], workdir: Path, env: dict[str, str]) -> list[LocalPreflight]:
    """Starts the preflight of each pod of `gang` (V1Pods, all Running); [] when the gang's
    pods run none."""
    endpoint = f"127.0.0.1:{free_port()}"
    path = os.pathsep.join(filter(None, [str(TRAINING_ROOT), env.get("PYTHONPATH", "")]))
    runs = []
    for pod in gang:
        name = pod.metadata.name
        report = workdir / f"{name}.preflight.json"
        report.unlink(missing_ok=True)
        argv = local_argv(list(pod.spec.containers[0].command), endpoint=endpoint, report=report)
        if argv is None:
            return []
        log = workdir / f"{name}.preflight.log"
        process = subprocess.Popen(
            argv,
            env={**env, "PYTHONPATH": path, "TRAINIUM_NODE_NAME": pod.spec.node_name},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        runs.append(LocalPreflight(name, pod.spec.node_name, process, report, log))
    return runs


def finish(
    runs: list[LocalPreflight], core_api: Any, namespace: str, *, timeout: float
) -> dict[str, int]:
    """Waits (bounded) for every pod's preflight, then ends each pod whose check failed the
    way the kubelet would: Failed with the process's exit code and its report as the
    termination message. Returns each pod's exit code (0: it passed; the pod goes on)."""
    deadline = time.monotonic() + timeout
    codes = {}
    for run in runs:
        try:
            codes[run.pod] = run.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            run.process.kill()
            codes[run.pod] = run.process.wait()
    for run in runs:
        if codes[run.pod] == 0:
            continue
        message = run.report.read_text() if run.report.is_file() else None
        sim.simulate_pod_outcome(
            core_api,
            namespace,
            run.pod,
            succeeded=False,
            exit_code=codes[run.pod] if 0 < codes[run.pod] < 256 else 1,
            message=message,
        )
    return codes

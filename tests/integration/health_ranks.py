"""Ranks of the health-channel tests: local processes using the public profiler API with their
pod's env, authenticated by pod-bound tokens from the API server's TokenRequest."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client

from integration.conftest import shared_prefix
from integration.operator_harness import (
    ROOT,
    OperatorProcess,
    create_job,
    free_port,
    job_manifest,
    supervised,
    wait_gang_running,
    wait_phase,
)
from trainium_devcluster import sim
from trainium_operator.contract import channel as contract

# A rank: the public profiler API only (no profiling window: the channel runs regardless).
RANK_SCRIPT = """
import json, sys, time
from trainium_operator import profiler
from trainium_operator.profiler import channel

steps, step_s = int(sys.argv[1]), float(sys.argv[2])
profiler.start_profiling()
for i in range(steps):
    profiler.step(i)
    time.sleep(step_s)
    profiler.report(samples=8)
reporter = channel.current()
print(json.dumps({"sent": reporter.sent, "failures": reporter.failures,
                  "written": reporter.written,
                  "error": reporter.last_error, "reply": reporter.last_reply}))
profiler.stop_profiling()
"""


# A rank that freezes at one step until a file appears (rank 0: stuck; the others: waiting for
# it in the step's collective), the public profiler API only.
FREEZING_RANK_SCRIPT = """
import json, os, sys, time
from trainium_operator import profiler
from trainium_operator.profiler import channel

steps, step_s, freeze_at = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
release = sys.argv[4]

def wait_in_collective():
    while not os.path.exists(release):
        time.sleep(0.02)

profiler.start_profiling()
for i in range(steps):
    profiler.step(i)
    if i == freeze_at:
        wait_in_collective()
    time.sleep(step_s)
reporter = channel.current()
print(json.dumps({"sent": reporter.sent, "error": reporter.last_error,
                  "stacks": reporter.stacks_written}))
profiler.stop_profiling()
"""


@contextlib.contextmanager
def fast_health_operator(
    dev_cluster: Any, module: str, log_dir: Path, extra_args: tuple[str, ...] = ()
) -> Iterator[OperatorProcess]:
    """An operator of its own for test module `module`'s namespaces: it serves the health
    channel on a free port and wakes jobs every 0.5 s, so a test's stall or capture shows in
    seconds."""
    proc = OperatorProcess(
        kubeconfig=Path(dev_cluster.kubeconfig),
        namespace=shared_prefix(module) + "*",
        log_path=log_dir / "operator.log",
        extra_args=("--health-port", str(free_port()), "--progress-interval", "0.5", *extra_args),
    )
    with supervised(proc):
        yield proc


def pod_token(clients: Any, pod: Any, audience: str = contract.AUDIENCE) -> str:
    """A token for the pod's ServiceAccount bound to the pod: what the kubelet projects."""
    return sim.pod_token(clients.core, pod, audience)


def wait_account(clients: Any, namespace: str, name: str = "default") -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            clients.core.read_namespaced_service_account(name, namespace)
            return
        except client.ApiException:
            time.sleep(0.2)
    raise AssertionError(f"ServiceAccount {namespace}/{name} never appeared")


def rank_env(
    pod: Any, token_file: Path, rank: int, world: int, local: tuple[int, int] | None = None
) -> dict[str, str]:
    """The env of rank `rank` of the pod; `local`: (LOCAL_RANK, LOCAL_WORLD_SIZE) as torchrun
    sets them, so the pod's ranks report as one message (without it, each its own). The pod
    directory moves beside the token file: the test's "pods" share this host's /dev/shm."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINIUM_")}
    for name in (contract.LOCAL_RANK, contract.LOCAL_WORLD_SIZE):
        env.pop(name, None)
    for var in pod.spec.containers[0].env or []:
        if var.value is not None:
            env[var.name] = var.value
    env.pop("TRAINIUM_PROFILE", None)
    env[contract.TOKEN_FILE] = str(token_file)
    env[contract.POD_DIR] = str(token_file.parent / "pod-dir")
    if local is not None:
        env[contract.LOCAL_RANK], env[contract.LOCAL_WORLD_SIZE] = map(str, local)
    env.update(
        RANK=str(rank),
        GROUP_RANK=pod.metadata.labels["trainium.dev/node-rank"],
        WORLD_SIZE=str(world),
        PYTHONPATH=str(ROOT / "operator"),
    )
    return env


def start_rank(env: dict[str, str], steps: int, step_s: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RANK_SCRIPT, str(steps), str(step_s)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def start_freezing_rank(
    env: dict[str, str], steps: int, step_s: float, freeze_at: int, release: Path
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            FREEZING_RANK_SCRIPT,
            *map(str, (steps, step_s, freeze_at, release)),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def local_stacks(env: dict[str, str], root: Path) -> dict[str, str]:
    """`env` with the pod's stacks directory (on the shared volume) moved under `root`, the
    same path below it: a local rank writes where the pod would."""
    pod_path = env[contract.STACKS_DIR]
    return {**env, contract.STACKS_DIR: str(root / pod_path.lstrip("/"))}


def outcome(process: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def reporting_job(
    clients: Any,
    namespace: str,
    name: str,
    tmp_path: Path,
    *,
    processes: int = 1,
    health: dict[str, Any] | None = None,
    **spec: Any,
) -> tuple[Any, Path]:
    """A one-node job of `processes` ranks on the health channel (`health`: its spec.health, by
    default a report every 0.2 s; `spec`: more of its spec), Training, and its pod's pod-bound
    token written to a file of the test's (as the kubelet projects it)."""
    manifest = job_manifest(
        name,
        nodes=1,
        processesPerNode=processes,
        compile={"enabled": False},
        health=health or {"reportIntervalSeconds": 0.2},
        **spec,
    )
    create_job(clients, namespace, manifest)
    (pod,) = wait_gang_running(clients, namespace, name, "train", 0, nodes=1)
    wait_phase(clients, namespace, name, "Training")
    wait_account(clients, namespace)
    token = tmp_path / f"{name}-token"
    token.write_text(pod_token(clients, pod))
    return pod, token


def ranks_with_a_straggler(pod: Any, token: Path, steps: int) -> list[subprocess.Popen[str]]:
    """The pod's three ranks reporting `steps` steps, rank 2 30 % slower than the others
    (0.065 s a step against 0.05 s)."""
    return [
        start_rank(rank_env(pod, token, rank, 3), steps, 0.065 if rank == 2 else 0.05)
        for rank in range(3)
    ]

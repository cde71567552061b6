"""The TorchX CLI against the real local cluster with the operator running: `torchx run -s
trainium`, `torchx status`, `torchx log` and `torchx cancel` as subprocesses.

Pods on KWOK nodes run nothing: the test ends them (as in test_operator.py) and gives them a
log through KWOK's Logs objects, which the API server serves like a kubelet's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    ROOT,
    OperatorView,
    finish_pods,
    get_job,
    wait_gang_running,
    wait_phase,
    wait_running_gone,
)
from trainium_devcluster.sim import WaitTimeoutError, simulate_pod_logs, wait_for

pytest.importorskip("torchx")
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

TORCHX = str(Path(sys.executable).parent / "torchx")
COMPONENT = ROOT / "examples" / "torchx" / "trn1_dist_ddp.py"
SCRIPT = "/opt/trainium/trainium_training/pretrain.py"


def torchx(dev_cluster: Any, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(dev_cluster.kubeconfig), "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        [TORCHX, *args], capture_output=True, text=True, env=env, cwd=cwd, check=False, timeout=120
    )
    assert result.returncode == 0, f"torchx {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result


def torchx_run(dev_cluster: Any, namespace: str, *component: str) -> tuple[str, str]:
    """Submits; returns (app handle, TrainingJob name)."""
    result = torchx(
        dev_cluster,
        "run",
        "--json",
        "-s",
        "trainium",
        "-cfg",
        f"queue=test,namespace={namespace}",
        *component,
    )
    submitted = json.loads(result.stdout)
    handle: str = submitted["handle"]
    app_id: str = submitted["app_id"]
    assert handle == f"trainium://torchx/{app_id}"
    assert app_id.startswith(f"{namespace}:")
    return handle, app_id.split(":", 1)[1]


def served_log(clients: Any, namespace: str, pod: str) -> str:
    try:
        response = clients.core.read_namespaced_pod_log(
            pod, namespace, container="trainer", _preload_content=False
        )
    except Exception as error:
        if getattr(error, "status", None) in (400, 404, 500):
            return ""
        raise
    return str(response.data.decode())


def serve_log(clients: Any, namespace: str, pod: str, lines: list[str], path: Path) -> None:
    """Has KWOK serve `lines` as the pod's trainer log. KWOK serves it once its Logs object
    reached the KWOK controller's cache; on a loaded machine that has been seen to never happen
    for one object, so a Logs object not served within 30 s is created again (three tries)."""
    for attempt in range(3):
        if attempt:
            clients.custom.delete_namespaced_custom_object(
                "kwok.x-k8s.io", "v1alpha1", namespace, "logs", pod
            )
            time.sleep(1)
        simulate_pod_logs(clients.custom, namespace, pod, lines, path, containers=["trainer"])
        try:
            wait_for(
                lambda: served_log(clients, namespace, pod),
                until=lambda text: lines[-1] in text,
                timeout=30,
                description=f"KWOK serving the log of {pod}",
            )
            return
        except WaitTimeoutError:
            if attempt == 2:
                raise


def status_state(dev_cluster: Any, handle: str) -> str:
    out = torchx(dev_cluster, "status", handle).stdout
    line = next(line for line in out.splitlines() if line.strip().startswith("State:"))
    return line.split(":", 1)[1].strip()


def test_tutorial_style_launch_compiles_trains_logs_and_succeeds(
    dev_cluster: Any, namespace: str, operator: OperatorView, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    handle, name = torchx_run(
        dev_cluster,
        namespace,
        f"{COMPONENT}:generateAppDef",
        "--name",
        "bertcompile",
        "--script_args",
        "--batch_size 16 --grad_accum_usteps 32 --data_dir /data/shards --steps_this_run 10",
        "--nnodes",
        "2",
        "--nproc_per_node",
        "32",
        "--image",
        "example.com/bert:1",
        "--script",
        SCRIPT,
        "--precompile",
        "True",
        "--bf16",
        "True",
        "--cacheset",
        "bert-large",
        "--instance_type",
        "trn1.32xlarge",
    )
    compile_pods = wait_gang_running(clients, namespace, name, "compile", 0)
    command = compile_pods[0].spec.containers[0].command
    assert command[:2] == ["neuron_parallel_compile", "torchrun"]
    assert command[-2:] == ["--steps_this_run", "10"]
    assert "--rdzv_endpoint=etcd-server:2379" in command
    assert wait_for(
        lambda: status_state(dev_cluster, handle),
        until=lambda state: state == "RUNNING",
        timeout=30,
        description="torchx status RUNNING while compiling",
    )
    finish_pods(clients, namespace, compile_pods)

    train_pods = wait_gang_running(clients, namespace, name, "train", 0)
    for rank, pod in enumerate(train_pods):
        serve_log(
            clients,
            namespace,
            pod.metadata.name,
            [f"rank {rank}: step 1 loss 11.2", f"rank {rank}: step 2 loss 10.9"],
            tmp_path / f"{pod.metadata.name}.log",
        )
    logs = torchx(dev_cluster, "log", f"{handle}/role1/1").stdout
    assert "rank 1: step 2 loss 10.9" in logs
    assert "rank 0" not in logs
    filtered = torchx(dev_cluster, "log", "--regex", "step 1", f"{handle}/role1/0").stdout
    assert "rank 0: step 1 loss 11.2" in filtered
    assert "step 2" not in filtered

    finish_pods(clients, namespace, train_pods)
    wait_phase(clients, namespace, name, "Succeeded")
    assert status_state(dev_cluster, handle) == "SUCCEEDED"
    listed = torchx(dev_cluster, "list", "-s", "trainium").stdout
    assert name in listed


# TorchX's dist.ddp component: 2 nodes of 32 processes running /app/train.py.
DDP_2X32 = ("dist.ddp", "-j", "2x32", "--image", "example.com/train:1", "--script", "/app/train.py")


def test_dist_ddp_launch_trains_to_success(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    host = ("-h", "aws_trn1.32xlarge")
    handle, name = torchx_run(dev_cluster, namespace, *DDP_2X32, *host, "--", "--epochs", "2")
    pods = wait_gang_running(clients, namespace, name, "train", 0)
    container = pods[0].spec.containers[0]
    assert container.command.count("torchrun") == 1
    assert container.command[container.command.index("/app/train.py") + 1 :] == ["--epochs", "2"]
    assert container.resources.limits == {
        "aws.amazon.com/neuron": "16",
        "vpc.amazonaws.com/efa": "8",
    }
    finish_pods(clients, namespace, pods)
    wait_phase(clients, namespace, name, "Succeeded")
    assert status_state(dev_cluster, handle) == "SUCCEEDED"


def test_torchx_cancel_stops_the_pods_and_status_says_cancelled(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    handle, name = torchx_run(dev_cluster, namespace, *DDP_2X32)
    wait_gang_running(clients, namespace, name, "train", 0)
    torchx(dev_cluster, "cancel", handle)
    wait_running_gone(clients, namespace, name, "the cancelled job's pods deleted")
    assert get_job(clients, namespace, name)["spec"]["runPolicy"]["suspend"] is True
    assert status_state(dev_cluster, handle) == "CANCELLED"

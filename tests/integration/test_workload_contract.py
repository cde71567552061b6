"""The workload contract on the real local control plane: a script that knows none of our
flags runs through compile, a failed training gang and the restarted gang, reading only the
TRAINIUM_* environment; and a trn2.48xlarge job lands on trn2 nodes with their device counts.

KWOK pods run no container, so, as the demo does, each pod's own command runs on this
machine (the script part of it, with the pod's environment and /data mapped to a local
folder) and its exit code becomes the pod's outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from integration.operator_harness import (
    OperatorView,
    create_job,
    job_manifest,
    wait_gang_running,
    wait_phase,
)
from trainium_devcluster import cluster, kueue, objects
from trainium_devcluster.sim import simulate_pod_outcome
from trainium_operator.contract import workload_env

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

SCRIPT_IN_IMAGE = "/app/train.py"
# A plain argparse script: parse_args() refuses any argument it does not define, so an
# operator that appended --data_dir, --output_dir, --steps_this_run or --resume fails it.
PLAIN_SCRIPT = """
import argparse, json, os, pathlib, sys

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
args = parser.parse_args()

stage = os.environ["TRAINIUM_STAGE"]
attempt = int(os.environ["TRAINIUM_ATTEMPT"])
resume = os.environ["TRAINIUM_RESUME"] == "1"
out = pathlib.Path(os.environ["TRAINIUM_OUTPUT_DIR"])  # this gang's own directory
root = pathlib.Path(os.environ["TRAINIUM_OUTPUT_ROOT"])  # the earlier attempts' are under it
out.mkdir(parents=True, exist_ok=True)
earlier = [
    d / "checkpoint.json"
    for d in root.glob("attempt-*")
    if int(d.name.partition("-")[2]) < attempt and (d / "checkpoint.json").exists()
]
record = {
    "stage": stage,
    "attempt": attempt,
    "resume": resume,
    "restarts": int(os.environ["TRAINIUM_RESTART_COUNT"]),
    "epochs": args.epochs,
    "found_checkpoint": bool(earlier),
    "compile_steps": os.environ.get("TRAINIUM_COMPILE_STEPS"),
    "wrote_to": out.name,
}
with open(out / "runs.jsonl", "a") as log:
    log.write(json.dumps(record) + "\\n")
if stage == "train" and not resume:
    (out / "checkpoint.json").write_text(json.dumps({"epoch": 1}))
    sys.exit("simulated crash in epoch 2 after a checkpoint")
if stage == "train" and not earlier:
    sys.exit("asked to resume but no earlier attempt left a checkpoint")
"""


def _run_pod_locally(pod: Any, script: Path, shared: Path) -> int:
    """The script part of the pod's command with the pod's environment; returns its exit code."""
    container = pod.spec.containers[0]
    command = list(container.command)
    args = command[command.index(SCRIPT_IN_IMAGE) + 1 :]
    assert args == ["--epochs", "2"], f"the operator added arguments: {args}"
    env = {e.name: e.value for e in container.env if e.value is not None}
    env[workload_env.NODE_NAME] = pod.spec.node_name
    for name in (workload_env.OUTPUT_DIR, workload_env.OUTPUT_ROOT):
        env[name] = env[name].replace("/data", str(shared), 1)
    env["PATH"] = os.environ.get("PATH", "")
    result = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, check=False
    )
    return result.returncode


def _finish_with_local_runs(
    clients: Any, namespace: str, pods: list[Any], codes: list[int]
) -> None:
    for pod, code in zip(pods, codes, strict=True):
        try:
            simulate_pod_outcome(
                clients.core,
                namespace,
                pod.metadata.name,
                succeeded=code == 0,
                exit_code=code,
                reason=None if code == 0 else "Error",
            )
        except Exception as error:  # the operator may already stop a failed gang's peer
            if getattr(error, "status", None) != 404:
                raise


def test_a_plain_argparse_script_runs_compile_training_and_a_gang_restart_on_env_alone(
    dev_cluster: Any, namespace: str, operator: OperatorView, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    script = tmp_path / "train.py"
    script.write_text(PLAIN_SCRIPT)
    shared = tmp_path / "fsx"
    name = "plain"
    manifest = job_manifest(
        name,
        command={
            "script": SCRIPT_IN_IMAGE,
            "args": ["--epochs", "2"],
            "resumeArgs": [],
        },
        compile={"steps": 3},
    )
    create_job(clients, namespace, manifest)

    compile_pods = wait_gang_running(clients, namespace, name, "compile", 0)
    assert compile_pods[0].spec.containers[0].command[0] == "neuron_parallel_compile"
    codes = [_run_pod_locally(p, script, shared) for p in compile_pods]
    assert codes == [0, 0]
    _finish_with_local_runs(clients, namespace, compile_pods, codes)

    first = wait_gang_running(clients, namespace, name, "train", 0)
    codes = [_run_pod_locally(p, script, shared) for p in first]
    assert codes == [1, 1], "the script's simulated crash"
    _finish_with_local_runs(clients, namespace, first, codes)

    second = wait_gang_running(clients, namespace, name, "train", 1)
    codes = [_run_pod_locally(p, script, shared) for p in second]
    assert codes == [0, 0]
    _finish_with_local_runs(clients, namespace, second, codes)

    job = wait_phase(clients, namespace, name, "Succeeded")
    assert job["status"]["restarts"]["total"] == 1
    root = shared / "output" / namespace / name
    assert sorted(p.name for p in root.iterdir()) == ["attempt-0", "attempt-1", "compile-0"]
    runs = [
        json.loads(line)
        for gang in ("compile-0", "attempt-0", "attempt-1")
        for line in (root / gang / "runs.jsonl").read_text().splitlines()
    ]
    seen = [(r["stage"], r["attempt"], r["resume"], r["restarts"], r["wrote_to"]) for r in runs]
    assert seen == [
        ("compile", 0, False, 0, "compile-0"),
        ("compile", 0, False, 0, "compile-0"),
        ("train", 0, False, 0, "attempt-0"),
        ("train", 0, False, 0, "attempt-0"),
        ("train", 1, True, 1, "attempt-1"),
        ("train", 1, True, 1, "attempt-1"),
    ]
    assert [r["compile_steps"] for r in runs[:2]] == ["3", "3"]
    assert all(r["found_checkpoint"] for r in runs[4:])


@pytest.fixture(scope="module")
def trn2_nodes(dev_cluster: Any) -> Iterator[list[str]]:
    """Two fake trn2.48xlarge nodes beside the session's trn1 nodes (what `dev up
    --instance-type trn2.48xlarge` adds to a running cluster), removed again afterwards so
    the session's other tests see the cluster they expect."""
    nodes = objects.fake_nodes(2, "trn2.48xlarge")
    names = [n["metadata"]["name"] for n in nodes]
    created = cluster.create_nodes(dev_cluster.clients, nodes)
    cluster.create_csi_nodes(dev_cluster.clients, names)
    cluster.wait_until_ready(dev_cluster.clients, names)
    kueue.sync_cluster_queue(dev_cluster.clients)  # a trn2 flavor with their capacity
    yield names
    # Their CSINodes are owned by the Nodes and go with them; the quota shrinks once they are gone.
    cluster.delete_nodes(dev_cluster.clients, created)
    kueue.sync_cluster_queue(dev_cluster.clients)


def test_a_trn2_job_schedules_on_trn2_nodes_with_their_device_counts(
    dev_cluster: Any, namespace: str, operator: OperatorView, trn2_nodes: list[str]
) -> None:
    clients = dev_cluster.clients
    create_job(
        clients,
        namespace,
        job_manifest("big", instanceType="trn2.48xlarge", compile={"enabled": False}),
    )
    pods = wait_gang_running(clients, namespace, "big", "train", 0)
    assert sorted(p.spec.node_name for p in pods) == sorted(trn2_nodes)
    for pod in pods:
        container = pod.spec.containers[0]
        assert container.resources.limits == {
            "aws.amazon.com/neuron": "16",
            "vpc.amazonaws.com/efa": "16",
        }
        assert "--nproc_per_node=64" in container.command
        env = {e.name: e.value for e in container.env}
        assert env["NEURON_LOGICAL_NC_CONFIG"] == "2"
    wait_phase(clients, namespace, "big", "Training")


def test_a_pod_template_adds_volumes_and_a_sidecar_to_running_pods(
    dev_cluster: Any, namespace: str, operator: OperatorView
) -> None:
    clients = dev_cluster.clients
    template = {
        "metadata": {"labels": {"team": "nlp"}},
        "spec": {
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "initContainers": [{"name": "prep", "image": "busybox:1.36", "command": ["true"]}],
            "containers": [
                {"name": "exporter", "image": "example.com/exporter:1"},
                {"name": "trainer", "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]},
            ],
            "imagePullSecrets": [{"name": "ecr"}],
            "securityContext": {"fsGroup": 1000},
        },
    }
    create_job(
        clients,
        namespace,
        job_manifest("tmpl", compile={"enabled": False}, podTemplate=template),
    )
    pods = wait_gang_running(clients, namespace, "tmpl", "train", 0)
    for pod in pods:
        assert [c.name for c in pod.spec.containers] == ["trainer", "exporter"]
        assert [c.name for c in pod.spec.init_containers] == ["prep"]
        assert "scratch" in {v.name for v in pod.spec.volumes}
        assert "/scratch" in {m.mount_path for m in pod.spec.containers[0].volume_mounts}
        assert pod.spec.image_pull_secrets[0].name == "ecr"
        assert pod.spec.security_context.fs_group == 1000
        assert pod.metadata.labels["team"] == "nlp"
        assert pod.spec.restart_policy == "Never"


@pytest.mark.parametrize(
    ("template", "message"),
    [
        pytest.param(
            {"spec": {"restartPolicy": "Always"}},
            "spec.podTemplate.spec.restartPolicy is set by the operator",
            id="restart-policy",
        ),
        pytest.param(
            {"spec": {"serviceAccountName": "x"}},
            "use spec.serviceAccountName",
            id="service-account",
        ),
        pytest.param(
            {"metadata": {"labels": {"trainium.dev/job-name": "other"}}},
            "the operator selects its pods on its own",
            id="selector-label",
        ),
    ],
)
def test_a_pod_template_overriding_an_owned_field_is_refused_at_apply(
    dev_cluster: Any, namespace: str, template: dict[str, Any], message: str
) -> None:
    with pytest.raises(Exception) as refused:  # noqa: PT011 - ApiException; checked below
        create_job(dev_cluster.clients, namespace, job_manifest("bad", podTemplate=template))
    assert getattr(refused.value, "status", None) == 422
    assert message in str(getattr(refused.value, "body", ""))

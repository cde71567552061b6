"""The profile-upload side pod on the dev cluster. KWOK runs no containers, so a test writes the
gang's profile into a local folder standing in for the claim, finds the upload pod the operator
created, and runs that pod's own command (read back from the API server) here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from integration.operator_harness import JOB_LABEL, eventually
from support.synthetic import SyntheticSpec, write_synthetic_profile
from trainium_devcluster.sim import simulate_pod_outcome


def write_profile(pods: list[Any], claim: Path, mount: str, **shape: Any) -> Path:
    """Writes a synthetic profile of `shape` (SyntheticSpec's fields) where the gang `pods`
    profiles, `claim` standing in for the claim mounted at `mount`; returns that folder."""
    env = {e.name: e.value for e in pods[0].spec.containers[0].env if e.value is not None}
    profile_dir = claim / env["TRAINIUM_PROFILE_DIR"].removeprefix(mount + "/")
    job, namespace = pods[0].metadata.labels[JOB_LABEL], pods[0].metadata.namespace
    write_synthetic_profile(profile_dir, SyntheticSpec(job_name=job, namespace=namespace, **shape))
    return profile_dir


def upload_pod(clients: Any, namespace: str, name: str) -> Any:
    """The job's profile-upload pod, once it runs."""

    def running() -> Any:
        pods = clients.core.list_namespaced_pod(
            namespace,
            label_selector=f"{JOB_LABEL}={name},trainium.dev/stage=profile-upload",
        ).items
        return pods[0] if pods and pods[0].status.phase == "Running" else None

    return eventually(running, timeout=60, description=f"{name}'s upload pod Running")


def play_upload_pod(
    clients: Any,
    namespace: str,
    pod: Any,
    claim: Path,
    *,
    env: dict[str, str] | None = None,
    message: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs the pod's command here (with `env` added), its mount's subPath of `claim` at the
    mount path, then ends the pod the same way (`message`: what its termination message says
    before the command's stderr)."""
    container = pod.spec.containers[0]
    assert container.command[:3] == ["python3", "-m", "trainium_operator.profiler.s3"]
    (mount,) = [m for m in container.volume_mounts if m.sub_path]
    local = [sys.executable, *container.command[1:]]
    local = [str(claim / mount.sub_path) if a == mount.mount_path else a for a in local]
    result = subprocess.run(
        local, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False
    )
    simulate_pod_outcome(
        clients.core,
        namespace,
        pod.metadata.name,
        succeeded=result.returncode == 0,
        exit_code=result.returncode or None,
        **({} if message is None else {"message": f"{message}\n{result.stderr}"}),
    )
    return result

"""The profiler's environment contract: the names the operator sets in training pods and the
profiler reads there, in one module both sides import (as `training_flags.py` does for the
script's flags). `builders/pods.py` writes them with `profiling_env` / `identity_env`;
`profiler/config.py` reads them in `ProfilerConfig.from_env`; a round-trip test builds a pod
and reads its env back, so the two cannot drift apart.
"""

from __future__ import annotations

from trainium_operator.contract import workload_env

# Set by the operator (builders/pods.py) on every training pod of a profiled job.
ENABLE = "TRAINIUM_PROFILE"  # "1" turns profiling on
DIR = "TRAINIUM_PROFILE_DIR"  # <mountPath>/profiles/<namespace>/<job>/<attempt>
STEPS = "TRAINIUM_PROFILE_STEPS"  # "<first>:<last>", the detailed window (inclusive)
# Set on every pod by the workload contract: the job's identity (the profiler records it in
# profile.json) and the node (downward API spec.nodeName: the node directory of the rank files).
NODE = workload_env.NODE_NAME
JOB_NAME = workload_env.JOB_NAME
JOB_NAMESPACE = workload_env.JOB_NAMESPACE
JOB_UID = workload_env.JOB_UID
ATTEMPT = workload_env.ATTEMPT
# Tuning knobs a job may set through spec.env (the operator never sets them).
SOURCES = "TRAINIUM_PROFILE_SOURCES"
RING_EVENTS = "TRAINIUM_PROFILE_RING_EVENTS"
FLUSH_MS = "TRAINIUM_PROFILE_FLUSH_MS"
SAMPLE_MS = "TRAINIUM_PROFILE_SAMPLE_MS"
SYNC_S = "TRAINIUM_PROFILE_SYNC_S"
# torchrun's rank identity, read (never set) by the profiler.
TORCHRUN_RANK_NAMES = ("RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE")

OPERATOR_SET = (ENABLE, DIR, STEPS, NODE, JOB_NAME, JOB_NAMESPACE, JOB_UID, ATTEMPT)


def format_steps(first: int, last: int) -> str:
    return f"{first}:{last}"


def profiling_env(profile_dir: str, first_step: int, last_step: int) -> dict[str, str]:
    """What a training pod of a profiled job gets, in this order."""
    return {ENABLE: "1", DIR: profile_dir, STEPS: format_steps(first_step, last_step)}


def identity_env(job_name: str, namespace: str, uid: str, attempt: int) -> dict[str, str]:
    """The job identity every pod gets (the node name comes from the downward API)."""
    return {JOB_NAME: job_name, JOB_NAMESPACE: namespace, JOB_UID: uid, ATTEMPT: str(attempt)}

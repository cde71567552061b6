"""Neuron Explorer's capture environment: the runtime variables the operator sets on training
pods of a profiled job, and the layout the profiler's Neuron source reads back from the shared
volume. One module both sides import (`builders/pods.py` writes the env with
`neuron_inspect_env`; `profiler/sources/neuron.py` reads the capture it produces).

The variables are the Neuron runtime's (Neuron Explorer docs, "environment variables" and "how
to profile a workload"), set before the runtime starts; no code change in the script:

| variable | xla stack | native stack (TorchNeuron) |
|---|---|---|
| `NEURON_RT_INSPECT_ENABLE` | 1 | 1 |
| `NEURON_RT_INSPECT_OUTPUT_DIR` | `<profile dir>/<node>/neuron` | the same |
| `NEURON_RT_INSPECT_SYSTEM_PROFILE` | 1 | 1 |
| `NEURON_RT_INSPECT_DEVICE_PROFILE` | 1 (per model) or 0 | `session` or 0 |
| `NEURON_RT_INSPECT_CPU_UTIL` | not set | 1 |
| `NEURON_RT_INSPECT_HOST_MEMORY` | not set | 1 |

`session` because the docs say it "is required on PJRT runtimes (PyTorch native, JAX)" to get
device profiles (.ntff). CPU utilisation and host memory follow the docs' recipe for a
torchrun or multi-node job. The runtime writes one directory per process,
`<instance id>_pid_<pid>/`, so ranks sharing the volume never collide.

Standard library only: the training images carry the profiler package without our
dependencies.
"""

from __future__ import annotations

from typing import Final

from trainium_operator.contract import neff_cache, workload_env

INSPECT_ENABLE: Final = "NEURON_RT_INSPECT_ENABLE"
INSPECT_OUTPUT_DIR: Final = "NEURON_RT_INSPECT_OUTPUT_DIR"
INSPECT_SYSTEM_PROFILE: Final = "NEURON_RT_INSPECT_SYSTEM_PROFILE"
INSPECT_DEVICE_PROFILE: Final = "NEURON_RT_INSPECT_DEVICE_PROFILE"
INSPECT_CPU_UTIL: Final = "NEURON_RT_INSPECT_CPU_UTIL"
INSPECT_HOST_MEMORY: Final = "NEURON_RT_INSPECT_HOST_MEMORY"
INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC: Final = "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC"
# Where TorchNeuron keeps compiled programs (NEFFs); a device profile (.ntff) is processed with
# the NEFF it ran, so the source records this directory beside the capture. The operator's
# compile stage owns its value (the persistent cache on the shared volume); profiling never
# changes it.
NEFF_CACHE_DIR: Final = neff_cache.NEFF_CACHE_DIR_ENV
DEFAULT_OUTPUT_DIR: Final = "./output"  # the runtime's default when the variable is unset

DEVICE_PROFILE_OFF: Final = "0"
DEVICE_PROFILE_PER_MODEL: Final = "1"  # the XLA stack's value (also spelt "model")
DEVICE_PROFILE_SESSION: Final = "session"  # required on PJRT runtimes (PyTorch native)

NEURON_SUBDIR: Final = "neuron"  # <profile dir>/<node>/neuron: the runtime's output dir
NODE_REFERENCE: Final = f"$({workload_env.NODE_NAME})"  # a pod-spec dependent-variable reference

STACKS: Final = workload_env.NEURON_STACKS


def capture_output_dir(profile_dir: str, node: str = NODE_REFERENCE) -> str:
    """`<profile_dir>/<node>/neuron`, beside the node's rank files."""
    return f"{profile_dir.rstrip('/')}/{node}/{NEURON_SUBDIR}"


def neuron_inspect_env(
    profile_dir: str,
    node: str = NODE_REFERENCE,
    *,
    stack: str = "xla",
    device_profile: bool = False,
    max_events_per_nc: int | None = None,
) -> dict[str, str]:
    """The runtime variables that capture into `<profile_dir>/<node>/neuron`, for `stack`.

    The default `node` is a Kubernetes dependent-variable reference, for pod specs that
    define TRAINIUM_NODE_NAME first. Must be in the environment before the runtime starts.
    """
    if stack not in STACKS:
        raise ValueError(f"unknown Neuron stack {stack!r}; one of {STACKS}")
    native = stack == "native"
    if not device_profile:
        device = DEVICE_PROFILE_OFF
    else:
        device = DEVICE_PROFILE_SESSION if native else DEVICE_PROFILE_PER_MODEL
    env = {
        INSPECT_ENABLE: "1",
        INSPECT_OUTPUT_DIR: capture_output_dir(profile_dir, node),
        INSPECT_SYSTEM_PROFILE: "1",
        INSPECT_DEVICE_PROFILE: device,
    }
    if native:
        env[INSPECT_CPU_UTIL] = "1"
        env[INSPECT_HOST_MEMORY] = "1"
    if max_events_per_nc is not None:
        env[INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC] = str(max_events_per_nc)
    return env

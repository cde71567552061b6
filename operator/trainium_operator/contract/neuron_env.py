"""Neuron Explorer capture for a profiled job: what the operator sets on its training pods, and
the layout the profiler's Neuron source reads back from the shared volume. One module both
sides import (`builders/pods.py` writes the env; `profiler/sources/neuron.py` and
`profiler/sources/torch_source.py` act on it).

Each stack captures with the control its runtime documents, into `<profile dir>/<node>/neuron`:

- xla stack (trn1): the runtime's environment variables (`neuron_inspect_env`). They capture
  the whole process: a system profile (the newest `NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC`
  events per NeuronCore, a ring buffer) and, per model, the device profile of its first
  execution. Layout `<instance id>_pid_<pid>/<files>`.
- native stack (TorchNeuron, trn2): torch.profiler with TorchNeuron's `NeuronConfig`, which our
  profiler starts and stops at the step window (`torch_capture_env` turns it on). It captures
  the window only, in `ProfileMode.DEVICE`, `RUNTIME`, `CPU_UTIL` and `HOST_MEMORY`. Layout
  `<instance id>_pid_<pid>/<timestamp>/<files>`.

Why not environment variables on the native stack: Neuron Explorer's docs say that "when
capturing with environment variables, profiling is enabled for the entire lifetime of the
application. For finer-grained control over specific code regions, use the PyTorch or JAX APIs
instead", and that `NEURON_RT_INSPECT_DEVICE_PROFILE=session` ("captures all device activity")
"is required on PJRT runtimes (PyTorch native, JAX)" to get device traces; the warm-up count
`NEURON_RT_INSPECT_DEVICE_PROFILE_NUM_WARMUP` (Neuron 2.33) is "only supported with model mode".
So on TorchNeuron only the torch.profiler integration captures a window
(tools/neuron-explorer/how-to-profile-workload.rst "Environment variable profiling",
environment-variables.rst, how-to-profile-pytorch.rst: `activities=[CPU, PrivateUse1]`,
`experimental_config=NeuronConfig(...)`, `torch.neuron.synchronize()` before export; its
output tree, "Expected output", adds the `<timestamp>/` level). The docs also say not to
combine `NEURON_RT_INSPECT_ENABLE=1` with torch.profiler, so a native pod gets no
`NEURON_RT_INSPECT_*` variable.

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
INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC: Final = "NEURON_RT_INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC"
# Where TorchNeuron keeps compiled programs (NEFFs); a device profile (.ntff) is processed with
# the NEFF it ran, so the source records this directory beside the capture. The operator's
# compile stage owns its value (the persistent cache on the shared volume); profiling never
# changes it.
NEFF_CACHE_DIR: Final = neff_cache.NEFF_CACHE_DIR_ENV
DEFAULT_OUTPUT_DIR: Final = "./output"  # the runtime's default when the variable is unset

DEVICE_PROFILE_OFF: Final = "0"
DEVICE_PROFILE_PER_MODEL: Final = "1"  # the XLA stack's value (also spelt "model")
# The native stack's torch.profiler capture: "1" has the profiler's torch source pass
# TorchNeuron's NeuronConfig (device, runtime, CPU and host-memory modes) for the step window.
TORCH_CAPTURE: Final = "TRAINIUM_PROFILE_NEURON_DEVICE"

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
    """The runtime variables that capture the XLA stack into `<profile_dir>/<node>/neuron`.

    The default `node` is a Kubernetes dependent-variable reference, for pod specs that
    define TRAINIUM_NODE_NAME first. Must be in the environment before the runtime starts. The
    native stack is refused: its environment capture would record the whole run
    (`torch_capture_env` captures the step window instead).
    """
    if stack not in STACKS:
        raise ValueError(f"unknown Neuron stack {stack!r}; one of {STACKS}")
    if stack != "xla":
        raise ValueError(
            "the native stack captures through torch.profiler (torch_capture_env): Neuron's "
            "environment-variable capture records the whole run on TorchNeuron"
        )
    env = {
        INSPECT_ENABLE: "1",
        INSPECT_OUTPUT_DIR: capture_output_dir(profile_dir, node),
        INSPECT_SYSTEM_PROFILE: "1",
        INSPECT_DEVICE_PROFILE: DEVICE_PROFILE_PER_MODEL if device_profile else DEVICE_PROFILE_OFF,
    }
    if max_events_per_nc is not None:
        env[INSPECT_SYS_TRACE_MAX_EVENTS_PER_NC] = str(max_events_per_nc)
    return env


def torch_capture_env() -> dict[str, str]:
    """What a native-stack pod gets for device profiling: the profiler's torch source then
    captures Neuron's device and runtime profiles for the step window, into
    `<profile dir>/<node>/neuron` (the node directory the profiler already knows)."""
    return {TORCH_CAPTURE: "1"}

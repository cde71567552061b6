"""A TorchX AppDef as a TrainingJob: pure, no cluster.

The mapping is honest: what a TrainingJob can express is carried over, the operator's own
parts replace the AppDef's (the operator builds torchrun and neuron_parallel_compile itself,
so a command that already holds them is unwrapped, never wrapped twice), and anything that
cannot be expressed is refused with an AppDefError naming the part and what to do instead.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from torchx import specs

from trainium_operator.api import instance_types
from trainium_operator.api import spec as spec_model
from trainium_operator.api.instance_types import INSTANCE_TYPES
from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import MAX_JOB_NAME_LENGTH
from trainium_operator.contract import workload_env

NEURON_PARALLEL_COMPILE = "neuron_parallel_compile"
# The step limit neuron_parallel_compile's documentation has the compile run use (it must
# match the real run except for it); in a precompile command it becomes the compile stage's.
STEPS_THIS_RUN = "--steps_this_run"
SHELLS = ("bash", "sh", "/bin/bash", "/bin/sh", "/usr/bin/bash")
PYTHONS = re.compile(r"^(/usr/(local/)?bin/)?python(3(\.\d+)?)?$")
TORCHRUN_MODULE = "torch.distributed.run"
# torchrun options that take no value.
TORCHRUN_FLAGS = {"--standalone", "--no_python", "--no-python", "--run_path", "--run-path"}
# Per-replica macros become the pod's node rank through Kubernetes' $(VAR) expansion.
NODE_RANK_REFERENCE = f"$({workload_env.NODE_RANK})"
CACHE_DIR_FLAGS = re.compile(r"^--cache_dir=(?P<root>.+)/(?P<set>[A-Za-z0-9_-]+)_\$\{replica_id\}$")
ANNOTATION_APP_NAME = "trainium.dev/torchx-app-name"


class AppDefError(ValueError):
    """The AppDef cannot become a TrainingJob; the message says which part and why."""


@dataclass(frozen=True)
class RunConfig:
    """The `trainium` scheduler's run options (`torchx runopts trainium`)."""

    namespace: str = "default"
    queue: str | None = None
    priority_class: str | None = None
    service_account: str | None = None
    instance_type: str | None = None
    etcd_endpoint: str | None = None
    neuron_stack: str | None = None  # spec.neuron.stack; None: the instance type's default
    lnc: int | None = None


@dataclass
class _Command:
    script: str
    args: list[str]
    compile_stage: bool = False
    nproc_per_node: int | None = None
    nnodes: str | None = None
    rendezvous: Obj = field(default_factory=dict)


def job_name(app_name: str, suffix: str) -> str:
    """A DNS-1035 name of at most MAX_JOB_NAME_LENGTH characters ending in `-<suffix>`."""
    base = re.sub(r"[^a-z0-9-]+", "-", app_name.lower()).strip("-")
    base = re.sub(r"^[^a-z]+", "", base) or "app"
    base = base[: MAX_JOB_NAME_LENGTH - len(suffix) - 1].rstrip("-")
    return f"{base}-{suffix}"


def _split_option(token: str, rest: list[str]) -> tuple[str, str | None, list[str]]:
    """(--name, value, remaining tokens) for --name=value or --name value."""
    if "=" in token:
        name, value = token.split("=", 1)
        return name, value, rest
    if token in TORCHRUN_FLAGS or not rest:
        return token, None, rest
    return token, rest[0], rest[1:]


def _parse_torchrun(tokens: list[str]) -> _Command:
    """torchrun's own options (replaced by the operator's), then the script and its args."""
    options: dict[str, str | None] = {}
    rest = list(tokens)
    while rest and rest[0].startswith("-"):
        token, rest = rest[0], rest[1:]
        if token in ("-m", "--module"):
            raise AppDefError(
                "torchrun -m <module>: a TrainingJob runs a script file; give the module's path "
                "(e.g. /app/pkg/train.py) instead"
            )
        name, value, rest = _split_option(token, rest)
        options[name.lstrip("-").replace("-", "_")] = value
    if not rest:
        raise AppDefError("the torchrun command names no script")
    command = _Command(script=rest[0], args=rest[1:])
    nproc = options.get("nproc_per_node")
    if nproc and nproc.isdigit():
        command.nproc_per_node = int(nproc)
    command.nnodes = options.get("nnodes")
    backend = options.get("rdzv_backend")
    if backend in {"etcd", "etcd-v2"}:
        endpoint = options.get("rdzv_endpoint")
        command.rendezvous = {"backend": "etcd", "endpoint": endpoint}
    return command


def _python_script(tokens: list[str]) -> _Command:
    """python [options] script args, or python -m torch.distributed.run ..."""
    rest = tokens[1:]
    while rest and rest[0].startswith("-") and rest[0] != "-m":
        rest = rest[1:]
    if rest[:1] == ["-m"]:
        if rest[1:2] == [TORCHRUN_MODULE]:
            return _parse_torchrun(rest[2:])
        raise AppDefError(
            f"python -m {rest[1] if len(rest) > 1 else ''}: a TrainingJob runs a script file "
            "under the operator's torchrun; give the script's path instead"
        )
    if not rest:
        raise AppDefError("the python command names no script")
    return _Command(script=rest[0], args=rest[1:])


def _parse_tokens(tokens: list[str]) -> _Command:
    if not tokens:
        raise AppDefError("the role has no entrypoint")
    head = tokens[0]
    if head == NEURON_PARALLEL_COMPILE:
        inner = tokens[1:]
        if len(inner) == 1:
            inner = shlex.split(inner[0])
        command = _parse_tokens(inner)
        command.compile_stage = True
        return command
    if head in SHELLS:
        if len(tokens) != 3 or tokens[1] != "-c":
            raise AppDefError(f"{head} without a single -c command string cannot be mapped")
        return _parse_tokens(shlex.split(tokens[2]))
    if head.rsplit("/", 1)[-1] == "torchrun":
        return _parse_torchrun(tokens[1:])
    if PYTHONS.match(head):
        return _python_script(tokens)
    # Anything else is the script itself (an executable file run by the operator's torchrun).
    return _Command(script=head, args=tokens[1:])


def parse_command(entrypoint: str, args: list[str]) -> _Command:
    """The role's command with any torchrun / neuron_parallel_compile wrapper taken off."""
    return _parse_tokens([entrypoint, *args])


def _substitute(value: str, app_id: str) -> str:
    if "${rank0_env}" in value:
        raise AppDefError(
            f"{value!r}: ${{rank0_env}} has no TrainingJob equivalent outside the torchrun "
            "command; the operator's rendezvous finds rank 0 itself"
        )
    values = specs.macros.Values(
        img_root="", app_id=app_id, replica_id=NODE_RANK_REFERENCE, rank0_env=""
    )
    result: str = values.substitute(value)
    return result


def _instance_type(resource: Any, cfg: RunConfig) -> str:
    named = (resource.capabilities or {}).get(instance_types.INSTANCE_TYPE_LABEL)
    chosen = named or cfg.instance_type or instance_types.DEFAULT_INSTANCE_TYPE
    if chosen not in INSTANCE_TYPES:
        known = ", ".join(INSTANCE_TYPES)
        raise AppDefError(
            f"instance type {chosen!r} (resource capability {instance_types.INSTANCE_TYPE_LABEL} "
            f"or the instance_type run option) is not a Trainium type; choose one of {known}"
        )
    return str(chosen)


def _check_devices(resource: Any, instance_type: str) -> None:
    shape = INSTANCE_TYPES[instance_type]
    devices = dict(resource.devices or {})
    neuron = [
        devices.pop(name)
        for name in (instance_types.NEURON_RESOURCE, instance_types.NEURON_DEVICE_RESOURCE)
        if name in devices
    ]
    devices.pop(instance_types.EFA_RESOURCE, None)
    if neuron and max(neuron) != shape.neuron_devices:
        raise AppDefError(
            f"the role requests {max(neuron)} Neuron devices; a TrainingJob pod takes a whole "
            f"{instance_type} node ({shape.neuron_devices} devices): request all or none"
        )
    if devices:
        raise AppDefError(f"devices {sorted(devices)} cannot be requested on Trainium nodes")


def _requests(resource: Any, instance_type: str) -> dict[str, str]:
    """cpu and memory requests, unless they are a whole-node named resource (the pod owns the
    node anyway, and the node's full size never fits beside the system daemons)."""
    shape = INSTANCE_TYPES[instance_type]
    requests: dict[str, str] = {}
    cpu = resource.cpu or 0
    mem = resource.memMB or 0
    if 0 < cpu < shape.cpu:
        requests["cpu"] = str(cpu)
    if 0 < mem < shape.memory_gib * 1024 * 0.9:
        requests["memory"] = f"{mem}Mi"
    return requests


def _mounts(role: Any) -> tuple[Obj | None, Obj]:
    """(storage, podTemplate) from the role's mounts: the first volume is the shared claim,
    further volumes and bind mounts are added to the pods through spec.podTemplate."""
    storage: Obj | None = None
    volumes: list[Obj] = []
    mounts: list[Obj] = []
    for index, mount in enumerate(role.mounts or []):
        name = f"torchx-mount-{index}"
        if isinstance(mount, specs.VolumeMount):
            if storage is None and not mount.read_only:
                storage = {"claimName": mount.src, "mountPath": mount.dst_path}
                continue
            volumes.append(
                {
                    "name": name,
                    "persistentVolumeClaim": {"claimName": mount.src, "readOnly": mount.read_only},
                }
            )
        elif isinstance(mount, specs.BindMount):
            volumes.append({"name": name, "hostPath": {"path": mount.src_path}})
        elif isinstance(mount, specs.DeviceMount):
            if mount.src_path.startswith(("/dev/neuron", "/dev/infiniband")):
                continue  # the Neuron and EFA device plugins mount these with the resources
            raise AppDefError(f"device mount {mount.src_path}: only Neuron/EFA devices exist here")
        else:
            raise AppDefError(f"mount {mount!r} cannot be mapped")
        mounts.append(
            {"name": name, "mountPath": mount.dst_path, "readOnly": bool(mount.read_only)}
        )
    template: Obj = {}
    if volumes:
        template = {
            "spec": {
                "volumes": volumes,
                "containers": [{"name": "trainer", "volumeMounts": mounts}],
            }
        }
    return storage, template


def app_to_training_job(app: Any, cfg: RunConfig, *, name: str) -> Obj:
    """The TrainingJob manifest for a one-role AppDef, or AppDefError."""
    if len(app.roles) != 1:
        roles = ", ".join(r.name for r in app.roles)
        raise AppDefError(
            f"app {app.name!r} has {len(app.roles)} roles ({roles}); a TrainingJob runs one "
            "gang of identical nodes: submit each role as its own app"
        )
    (role,) = app.roles
    if role.min_replicas is not None and role.min_replicas != role.num_replicas:
        raise AppDefError(
            f"role {role.name!r}: min_replicas {role.min_replicas} != num_replicas "
            f"{role.num_replicas}; elastic jobs are not supported (the gang restarts as a whole)"
        )
    command = parse_command(role.entrypoint, list(role.args))
    if command.nnodes is not None and command.nnodes not in (
        str(role.num_replicas),
        f"{role.num_replicas}:{role.num_replicas}",
    ):
        raise AppDefError(
            f"torchrun --nnodes {command.nnodes} differs from the role's num_replicas "
            f"{role.num_replicas}"
        )
    instance_type = _instance_type(role.resource, cfg)
    _check_devices(role.resource, instance_type)

    spec: Obj = {
        "image": role.image,
        "command": {"script": command.script, "args": [_substitute(a, name) for a in command.args]},
        "nodes": role.num_replicas,
        "instanceType": instance_type,
        "runPolicy": {"backoffLimit": role.max_retries},
    }
    if command.nproc_per_node is not None:
        spec["processesPerNode"] = command.nproc_per_node
    if cfg.neuron_stack is not None:
        if cfg.neuron_stack not in workload_env.NEURON_STACKS:
            raise AppDefError(
                f"neuron_stack {cfg.neuron_stack!r} is not a Neuron stack; choose one of "
                + ", ".join(workload_env.NEURON_STACKS)
            )
        spec["neuron"] = {"stack": cfg.neuron_stack}
    if cfg.lnc is not None:
        spec["lnc"] = cfg.lnc
    compile_spec: Obj = {"enabled": command.compile_stage}
    args = spec["command"]["args"]
    if command.compile_stage and STEPS_THIS_RUN in args[:-1]:
        at = args.index(STEPS_THIS_RUN)
        compile_spec["steps"] = int(args[at + 1])
        compile_spec["stepsArg"] = STEPS_THIS_RUN
        del args[at : at + 2]
    env: list[Obj] = []
    for key, value in role.env.items():
        cache = CACHE_DIR_FLAGS.match(value) if key == "NEURON_CC_FLAGS" else None
        if cache:
            # The operator builds exactly <cacheDir>/<cacheSet>_<node rank> itself.
            compile_spec["cacheDir"] = cache["root"]
            compile_spec["cacheSet"] = cache["set"]
            continue
        env.append({"name": key, "value": _substitute(value, name)})
    spec["compile"] = compile_spec
    if env:
        spec["env"] = env
    rendezvous = cfg.etcd_endpoint and {"backend": "etcd", "endpoint": cfg.etcd_endpoint}
    if command.rendezvous or rendezvous:
        spec["rendezvous"] = command.rendezvous or rendezvous
    requests = _requests(role.resource, instance_type)
    if requests:
        spec["resources"] = {"requests": requests}
    storage, template = _mounts(role)
    if storage:
        spec["storage"] = storage
    if template:
        spec["podTemplate"] = template
    scheduling: Obj = {}
    if cfg.queue:
        scheduling["queue"] = cfg.queue
    if cfg.priority_class:
        scheduling["priorityClassName"] = cfg.priority_class
    if scheduling:
        spec["scheduling"] = scheduling
    if cfg.service_account:
        spec["serviceAccountName"] = cfg.service_account
    return {
        "apiVersion": spec_model.API_VERSION,
        "kind": spec_model.KIND,
        "metadata": {
            "name": name,
            "namespace": cfg.namespace,
            "annotations": {ANNOTATION_APP_NAME: app.name},
        },
        "spec": spec,
    }

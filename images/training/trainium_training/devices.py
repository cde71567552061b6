"""The device layer: one training loop, two Neuron stacks.

The stack comes from the workload contract's `TRAINIUM_NEURON_STACK` (`xla` | `native`,
absent = `xla`), which the operator sets from the job's spec:

* stack `xla` (trn1; torch-neuronx 2.9 with PyTorch/XLA):
  * `XlaBackend`: Neuron (or any PJRT device) through torch-xla, as the reference tutorial
    uses it: process group `xla` initialised from torchrun's environment, graphs cut with
    `torch_xla.sync()` (`xm.mark_step`), gradients all-reduced with `xm.reduce_gradients`,
    host-side logging deferred with `xm.add_step_closure` so it never stalls the device.
    Chosen automatically when torch-neuronx is importable.
  * `CpuBackend`: plain PyTorch on the CPU with the gloo process group; the same calls are
    immediate.
* stack `native` (trn2/trn3; TorchNeuron, torch-neuronx 2.13+ as a PyTorch device):
  `NativeBackend`, standard PyTorch only: the device from `torch.accelerator` (`neuron` once
  torch-neuronx has registered it), process group `neuron`, DDP for gradient averaging
  (`no_sync` across accumulation micro-batches), `torch.compile(backend="neuron")`. With no
  Neuron device it runs the same code with the CPU device, gloo, and torch.compile off (or a
  CPU backend chosen with `--compile_backend`): the path the CPU tests run.

The XLA backend is written against the documented torch-xla 2.9 / torch-neuronx 2.9 APIs
(the last Neuron release with XLA-based torch-neuronx, 2.31). It has run here on torch-xla's
CPU PJRT device only, never on Trainium hardware. The native backend has run here on the CPU
device only; its Neuron calls follow the TorchNeuron docs (2.33) and are untested on hardware.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.util
import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Final, Protocol

import torch
import torch.distributed as dist
from torch import nn

from trainium_operator.contract import workload_env
from trainium_training import checkpoints
from trainium_training.choices import COMPILE_BACKEND_CHOICES, DEVICE_CHOICES

log = logging.getLogger(__name__)

NEURON_DEVICE: Final = "neuron"
GRAPH_EXTRACTION_ENV: Final = "NEURON_EXTRACT_GRAPHS_ONLY"
"""Set by neuron_parallel_compile while it runs the script to collect graphs."""

_ALL_REDUCE_BUCKET_ELEMENTS: Final = 1 << 23  # 32 MiB of fp32 per gloo call
_PROCESS_GROUP_TIMEOUT: Final = datetime.timedelta(minutes=30)


def graph_extraction_mode(environ: Mapping[str, str]) -> bool:
    """True under neuron_parallel_compile's graph extraction (outputs are not real).

    The tutorial's test: the variable is set to a non-empty value.
    """
    return bool(environ.get(GRAPH_EXTRACTION_ENV))


class Backend(Protocol):
    """What the training loop needs from a device."""

    name: str
    stack: str  # the Neuron stack this backend belongs to (workload_env.NEURON_STACKS)
    device: torch.device
    process_group_backend: str | None  # None: a single process, no process group
    compile_backend: str | None  # the torch.compile backend, None when the model runs eagerly
    rank: int
    local_rank: int
    world_size: int

    def default_dtype(self) -> torch.dtype: ...

    def prepare_model(self, model: nn.Module) -> nn.Module:
        """The module the step calls (wrapped for data parallelism, compiled); `model` itself
        keeps the parameters, and its state_dict is what checkpoints hold."""

    def accumulating(self, model: nn.Module, last: bool) -> AbstractContextManager[None]:
        """Around one micro-batch's forward and backward: gradient averaging may wait for the
        `last` micro-batch of the step."""

    def seed(self, seed: int) -> None:
        """Seed every RNG the step uses (dropout on the device, host RNGs)."""

    def to_device(self, array: Any) -> torch.Tensor: ...

    def mark_step(self) -> None:
        """End of a graph: XLA compiles/executes what was traced; a no-op elsewhere."""

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Average the gradients of the optimizer's parameters over all ranks."""

    def mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor: ...

    def after_step(self, fn: Callable[..., None], args: Sequence[Any]) -> None:
        """Run `fn(*args)` on the host once this step's values exist."""

    def synchronize(self) -> None:
        """Wait for the device to finish what was queued."""

    def save_checkpoint(self, payload: Mapping[str, Any], directory: Path, step: int) -> Path:
        """Write checkpoint `step` (rank 0 calls it; tensors already on the host)."""

    def barrier(self, tag: str) -> None: ...

    def shutdown(self) -> None: ...


def _int_env(environ: Mapping[str, str], name: str, default: int) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


class CpuBackend:
    """CPU tensors, gloo collectives; world size 1 (no process group) without torchrun."""

    name = "cpu"
    stack = "xla"  # the XLA stack's CPU stand-in, as before the native stack existed
    compile_backend: str | None = None

    def __init__(self, environ: Mapping[str, str], dtype: torch.dtype = torch.float32) -> None:
        self.device = torch.device("cpu")
        self.world_size = _int_env(environ, "WORLD_SIZE", 1)
        self.rank = _int_env(environ, "RANK", 0)
        self.local_rank = _int_env(environ, "LOCAL_RANK", 0)
        self._dtype = dtype
        self._distributed = self.world_size > 1
        self.process_group_backend = "gloo" if self._distributed else None
        if self._distributed and not dist.is_initialized():
            dist.init_process_group("gloo", timeout=_PROCESS_GROUP_TIMEOUT)

    def default_dtype(self) -> torch.dtype:
        return self._dtype

    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model

    def accumulating(self, model: nn.Module, last: bool) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        return None

    def save_checkpoint(self, payload: Mapping[str, Any], directory: Path, step: int) -> Path:
        return checkpoints.save_atomic(payload, directory, step)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def to_device(self, array: Any) -> torch.Tensor:
        return torch.as_tensor(array)

    def mark_step(self) -> None:
        return None

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if not self._distributed:
            return
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if p.grad is not None
        ]
        for bucket in _buckets(grads, _ALL_REDUCE_BUCKET_ELEMENTS):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat)
            flat.div_(self.world_size)
            offset = 0
            for grad in bucket:
                count = grad.numel()
                grad.copy_(flat[offset : offset + count].view_as(grad))
                offset += count

    def mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        if not self._distributed:
            return value
        total = value.detach().clone()
        dist.all_reduce(total)
        return total / self.world_size

    def after_step(self, fn: Callable[..., None], args: Sequence[Any]) -> None:
        fn(*args)

    def barrier(self, tag: str) -> None:
        if self._distributed:
            dist.barrier()

    def shutdown(self) -> None:
        if self._distributed and dist.is_initialized():
            dist.destroy_process_group()


def _buckets(tensors: Iterable[torch.Tensor], limit: int) -> list[list[torch.Tensor]]:
    """Group tensors in order so each group holds at most `limit` elements (or one tensor)."""
    groups: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []
    size = 0
    for tensor in tensors:
        if current and size + tensor.numel() > limit:
            groups.append(current)
            current, size = [], 0
        current.append(tensor)
        size += tensor.numel()
    if current:
        groups.append(current)
    return groups


class XlaBackend:
    """torch-xla (Neuron through torch-neuronx); see the module docstring."""

    name = "xla"
    stack = "xla"
    compile_backend: str | None = None

    def __init__(self, environ: Mapping[str, str], dtype: torch.dtype) -> None:
        # torch_xla modules are untyped for mypy; keep them behind Any.
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.distributed.xla_backend  # registers the "xla" process-group backend

        self._torch_xla: Any = torch_xla
        self._xm: Any = xm
        self._dtype = dtype
        self._distributed = "WORLD_SIZE" in environ
        if self._distributed and not dist.is_initialized():
            dist.init_process_group("xla", init_method="xla://")
        self.world_size = dist.get_world_size() if self._distributed else 1
        self.rank = dist.get_rank() if self._distributed else 0
        self.local_rank = _int_env(environ, "LOCAL_RANK", 0)
        launched = _int_env(environ, "WORLD_SIZE", 1)
        if self.world_size != launched:
            # E.g. torch-xla's CPU device is single-process: every rank would train alone and
            # all of them would write rank 0's checkpoints.
            raise RuntimeError(
                f"torchrun started WORLD_SIZE={launched} ranks but the XLA process group holds "
                f"{self.world_size} (PJRT_DEVICE={environ.get('PJRT_DEVICE', '')}); run "
                "multi-process XLA on Neuron devices, or use --device cpu"
            )
        device_fn = getattr(torch_xla, "device", None)
        self.device = device_fn() if device_fn is not None else xm.xla_device()
        self.process_group_backend = "xla" if self._distributed else None

    def default_dtype(self) -> torch.dtype:
        return self._dtype

    def prepare_model(self, model: nn.Module) -> nn.Module:
        # Gradients are all-reduced by reduce_gradients; the graphs are XLA's (no torch.compile).
        return model

    def accumulating(self, model: nn.Module, last: bool) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        self._xm.wait_device_ops()

    def save_checkpoint(self, payload: Mapping[str, Any], directory: Path, step: int) -> Path:
        # The payload's tensors were moved to the host (checkpoints.to_cpu), which executed
        # the pending graph; the file is written as on the CPU.
        return checkpoints.save_atomic(payload, directory, step)

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        self._xm.set_rng_state(seed, device=self.device)

    def to_device(self, array: Any) -> torch.Tensor:
        return torch.as_tensor(array).to(self.device)

    def mark_step(self) -> None:
        sync = getattr(self._torch_xla, "sync", None)
        if sync is not None:
            sync()
        else:
            self._xm.mark_step()

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        self._xm.reduce_gradients(optimizer)

    def mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        if self.world_size == 1:
            return value
        reduced: torch.Tensor = self._xm.all_reduce(
            self._xm.REDUCE_SUM, value, scale=1.0 / self.world_size
        )
        return reduced

    def after_step(self, fn: Callable[..., None], args: Sequence[Any]) -> None:
        self._xm.add_step_closure(fn, args=tuple(args))

    def barrier(self, tag: str) -> None:
        self._xm.rendezvous(tag)

    def shutdown(self) -> None:
        # The tutorial ends with a final mark_step: pending closures then run before exit
        # (without it the run can end with a "Broken pipe" from the runtime).
        self.mark_step()
        self._xm.wait_device_ops()


class NativeBackend:
    """Standard PyTorch on TorchNeuron's `neuron` device, or on the CPU; see the module
    docstring. `compile_backend` None leaves the model eager."""

    name = "native"
    stack = "native"

    def __init__(
        self,
        environ: Mapping[str, str],
        dtype: torch.dtype,
        *,
        device_type: str,
        compile_backend: str | None,
    ) -> None:
        # The TorchNeuron docs place every rank's tensors on torch.device("neuron") without an
        # index: the runtime gives each process its own logical NeuronCore.
        self.device = torch.device(device_type)
        self.world_size = _int_env(environ, "WORLD_SIZE", 1)
        self.rank = _int_env(environ, "RANK", 0)
        self.local_rank = _int_env(environ, "LOCAL_RANK", 0)
        self.compile_backend: str | None = compile_backend
        self._dtype = dtype
        self._distributed = self.world_size > 1
        self.process_group_backend = (
            native_process_group_backend(device_type) if self._distributed else None
        )
        if self.process_group_backend is not None and not dist.is_initialized():
            dist.init_process_group(
                self.process_group_backend, init_method="env://", timeout=_PROCESS_GROUP_TIMEOUT
            )

    def default_dtype(self) -> torch.dtype:
        return self._dtype

    def seed(self, seed: int) -> None:
        torch.manual_seed(seed)  # seeds the CPU and every registered device, neuron included

    def to_device(self, array: Any) -> torch.Tensor:
        return torch.as_tensor(array).to(self.device)

    def prepare_model(self, model: nn.Module) -> nn.Module:
        prepared: nn.Module = model
        if self._distributed:
            # DDP averages gradients during backward; it broadcasts rank 0's weights first.
            prepared = nn.parallel.DistributedDataParallel(model)
        if self.compile_backend is not None:
            # dynamic=False: TorchNeuron rejects dynamic=True; each new shape compiles anew.
            prepared = compile_module(prepared, self.compile_backend)
        return prepared

    def accumulating(self, model: nn.Module, last: bool) -> AbstractContextManager[None]:
        ddp = _ddp_of(model)
        if ddp is None or last:
            return contextlib.nullcontext()
        # Only the step's last backward all-reduces; earlier ones just add up locally.
        no_sync: AbstractContextManager[None] = ddp.no_sync()
        return no_sync

    def mark_step(self) -> None:
        # Eager and compiled work is queued on the device as it is issued; there is no graph
        # to cut (a host read such as .item() waits for it).
        return None

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        # DDP averaged them in the last micro-batch's backward.
        return None

    def mean_over_ranks(self, value: torch.Tensor) -> torch.Tensor:
        if not self._distributed:
            return value
        total = value.detach().clone()
        dist.all_reduce(total)
        return total / self.world_size

    def after_step(self, fn: Callable[..., None], args: Sequence[Any]) -> None:
        fn(*args)

    def synchronize(self) -> None:
        if self.device.type != "cpu":
            accelerator_synchronize()

    def save_checkpoint(self, payload: Mapping[str, Any], directory: Path, step: int) -> Path:
        self.synchronize()
        return checkpoints.save_atomic(payload, directory, step)

    def barrier(self, tag: str) -> None:
        if self._distributed:
            dist.barrier()

    def shutdown(self) -> None:
        self.synchronize()
        if self._distributed and dist.is_initialized():
            dist.destroy_process_group()


def _ddp_of(model: nn.Module) -> nn.parallel.DistributedDataParallel | None:
    """The DDP module of a prepared model (itself, or under torch.compile's wrapper)."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, nn.parallel.DistributedDataParallel) else None


def compile_module(model: nn.Module, backend: str) -> nn.Module:
    """The compile wrapper: torch.compile with the backend named (TorchNeuron's is "neuron")."""
    compiled: nn.Module = torch.compile(model, backend=backend, dynamic=False)  # type: ignore[assignment]
    return compiled


def native_process_group_backend(device_type: str) -> str:
    """TorchNeuron's collectives backend on its device, gloo on the CPU."""
    return "neuron" if device_type == NEURON_DEVICE else "gloo"


def resolve_compile_backend(requested: str, device_type: str) -> str | None:
    """The torch.compile backend of a native run, None for eager."""
    if requested not in COMPILE_BACKEND_CHOICES:
        raise ValueError(
            f"--compile_backend {requested!r} is unknown; choose one of {COMPILE_BACKEND_CHOICES}"
        )
    if requested == "auto":
        return "neuron" if device_type == NEURON_DEVICE else None
    if requested == "off":
        return None
    if requested == "neuron" and device_type != NEURON_DEVICE:
        raise ValueError("--compile_backend neuron needs the Neuron device; this run is on the CPU")
    return requested


def accelerator_synchronize() -> None:
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "synchronize"):
        accelerator.synchronize()
        return
    getattr(torch, NEURON_DEVICE).synchronize()


def neuron_available() -> bool:
    return importlib.util.find_spec("torch_neuronx") is not None


def xla_available() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def neuron_stack(environ: Mapping[str, str]) -> str:
    """The stack the workload contract names (`TRAINIUM_NEURON_STACK`, absent = xla)."""
    stack = environ.get(workload_env.NEURON_STACK) or workload_env.DEFAULT_NEURON_STACK
    if stack not in workload_env.NEURON_STACKS:
        raise ValueError(
            f"{workload_env.NEURON_STACK}={stack!r} is unknown; the image runs one of "
            f"{workload_env.NEURON_STACKS}"
        )
    return stack


def native_neuron_device_present() -> bool:
    """True when TorchNeuron registered the `neuron` device and it has cores.

    PyTorch loads torch-neuronx itself when torch is imported (device-backend autoload); the
    explicit import covers TORCH_DEVICE_BACKEND_AUTOLOAD=0.
    """
    if not neuron_available():
        return False
    import torch_neuronx  # noqa: F401

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and hasattr(accelerator, "current_accelerator"):
        if not accelerator.is_available():
            return False
        current = accelerator.current_accelerator()
        return current is not None and current.type == NEURON_DEVICE
    module = getattr(torch, NEURON_DEVICE, None)
    return module is not None and bool(module.is_available())


def resolve_device(requested: str, environ: Mapping[str, str]) -> str:
    """The device kind of this run: `xla` or `cpu` on the XLA stack, `neuron` or `cpu` on the
    native one. On the XLA stack `auto` picks XLA when torch-neuronx is present (or torch-xla
    with PJRT_DEVICE set); on the native stack, the Neuron device when TorchNeuron has one."""
    if requested not in DEVICE_CHOICES:
        raise ValueError(f"--device {requested!r} is unknown; choose one of {DEVICE_CHOICES}")
    stack = neuron_stack(environ)
    if stack == "native":
        return _resolve_native_device(requested)
    if requested == NEURON_DEVICE:
        raise ValueError(
            f"--device neuron is the native stack's device and {workload_env.NEURON_STACK} is "
            "xla; use --device xla, or run the job on the native stack"
        )
    if requested == "xla" and not xla_available():
        raise ValueError(
            "--device xla needs torch-xla (torch-neuronx on Trainium), which is not installed; "
            "use --device cpu or the Neuron training image"
        )
    if requested != "auto":
        return requested
    if neuron_available() or (xla_available() and environ.get("PJRT_DEVICE")):
        return "xla"
    return "cpu"


def _resolve_native_device(requested: str) -> str:
    if requested == "xla":
        raise ValueError(
            f"--device xla is the XLA stack's device and {workload_env.NEURON_STACK} is native; "
            "use --device neuron (or auto), or run the job on the XLA stack"
        )
    if requested == "cpu":
        return "cpu"
    if native_neuron_device_present():
        return NEURON_DEVICE
    if requested == NEURON_DEVICE or neuron_available():
        # torch-neuronx is installed but gives no neuron device: the XLA build of the package,
        # or a node without Neuron devices. Training on the CPU there would only look alive.
        raise ValueError(
            f"{workload_env.NEURON_STACK}=native but PyTorch has no neuron device: the image "
            "needs TorchNeuron (torch-neuronx 2.13+, the native training image) and the pod "
            "Neuron devices (aws.amazon.com/neuron); pass --device cpu to train on the CPU"
        )
    return "cpu"


def prepare_neuron_environment(environ: MutableMapping[str, str], bf16: bool) -> None:
    """XLA stack: settings that must be in place before the Neuron runtime starts
    (setdefault only)."""
    if not neuron_available():
        return
    environ.setdefault("PJRT_DEVICE", "NEURON")
    flags = environ.get("NEURON_CC_FLAGS", "")
    if "--model-type" not in flags:
        # The tutorial compiles BERT with the transformer model type.
        environ["NEURON_CC_FLAGS"] = f"{flags} --model-type=transformer".strip()
    if bf16:
        # bf16 weights updated in place need stochastic rounding to keep small updates.
        environ.setdefault("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")


def prepare_native_environment(environ: MutableMapping[str, str], bf16: bool) -> None:
    """Native stack on the Neuron device: the runtime's stochastic rounding for bf16
    (setdefault only). The XLA-only settings (PJRT_DEVICE, NEURON_CC_FLAGS) are not set."""
    if bf16:
        environ.setdefault("NEURON_RT_STOCHASTIC_ROUNDING_EN", "1")


def create_backend(
    kind: str,
    environ: Mapping[str, str],
    dtype: torch.dtype,
    *,
    compile_backend: str = "auto",
) -> Backend:
    """The backend of device `kind` (from resolve_device) on the stack the contract names."""
    if neuron_stack(environ) == "native":
        return NativeBackend(
            environ,
            dtype,
            device_type=kind,
            compile_backend=resolve_compile_backend(compile_backend, kind),
        )
    if compile_backend not in ("auto", "off"):
        raise ValueError(
            f"--compile_backend {compile_backend} is for the native stack; the XLA stack's "
            "graphs are torch-xla's"
        )
    if kind == "xla":
        if neuron_available():
            import torch_neuronx  # noqa: F401  (registers the Neuron PJRT plugin)
        return XlaBackend(environ, dtype)
    return CpuBackend(environ, dtype)

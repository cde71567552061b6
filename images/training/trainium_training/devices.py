"""The device layer: one training loop, two backends.

* `XlaBackend`: Neuron (or any PJRT device) through torch-xla, as the reference tutorial uses
  it: process group `xla` initialised from torchrun's environment, graphs cut with
  `torch_xla.sync()` (`xm.mark_step`), gradients all-reduced with `xm.reduce_gradients`,
  host-side logging deferred with `xm.add_step_closure` so it never stalls the device.
  Chosen automatically when torch-neuronx is importable.
* `CpuBackend`: plain PyTorch on the CPU with the gloo process group; the same calls are
  immediate. This is the path the tests run.

The XLA backend is written against the documented torch-xla 2.9 / torch-neuronx 2.9 APIs
(the last Neuron release with XLA-based torch-neuronx, 2.31). It has run here on torch-xla's
CPU PJRT device only, never on Trainium hardware.
"""

from __future__ import annotations

import datetime
import importlib.util
import logging
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from typing import Any, Final, Protocol

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

DEVICE_CHOICES: Final = ("auto", "xla", "cpu")
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
    device: torch.device
    rank: int
    local_rank: int
    world_size: int

    def default_dtype(self) -> torch.dtype: ...

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

    def __init__(self, environ: Mapping[str, str], dtype: torch.dtype = torch.float32) -> None:
        self.device = torch.device("cpu")
        self.world_size = _int_env(environ, "WORLD_SIZE", 1)
        self.rank = _int_env(environ, "RANK", 0)
        self.local_rank = _int_env(environ, "LOCAL_RANK", 0)
        self._dtype = dtype
        self._distributed = self.world_size > 1
        if self._distributed and not dist.is_initialized():
            dist.init_process_group("gloo", timeout=_PROCESS_GROUP_TIMEOUT)

    def default_dtype(self) -> torch.dtype:
        return self._dtype

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

    def default_dtype(self) -> torch.dtype:
        return self._dtype

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


def neuron_available() -> bool:
    return importlib.util.find_spec("torch_neuronx") is not None


def xla_available() -> bool:
    return importlib.util.find_spec("torch_xla") is not None


def resolve_device(requested: str, environ: Mapping[str, str]) -> str:
    """`auto` picks XLA when torch-neuronx is present (or torch-xla with PJRT_DEVICE set)."""
    if requested not in DEVICE_CHOICES:
        raise ValueError(f"--device {requested!r} is unknown; choose one of {DEVICE_CHOICES}")
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


def prepare_neuron_environment(environ: MutableMapping[str, str], bf16: bool) -> None:
    """Settings that must be in place before the Neuron runtime starts (setdefault only)."""
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


def create_backend(kind: str, environ: Mapping[str, str], dtype: torch.dtype) -> Backend:
    if kind == "xla":
        if neuron_available():
            import torch_neuronx  # noqa: F401  (registers the Neuron PJRT plugin)
        return XlaBackend(environ, dtype)
    return CpuBackend(environ, dtype)

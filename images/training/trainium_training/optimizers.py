"""AdamW and LAMB with fp32 optimizer state, weight-decay groups and the warmup schedule.

Both optimizers keep their moments in fp32 whatever the parameters' dtype and do the update
arithmetic in fp32, writing the result back into the (bf16 on Neuron) parameter; with
`NEURON_RT_STOCHASTIC_ROUNDING_EN=1` the device rounds that write stochastically. They avoid
host synchronisation and data-dependent Python branches (the step count is a tensor, the trust
ratio uses `torch.where`), so under XLA one step traces to the same graph every time.

LAMB is "Large Batch Optimization for Deep Learning: Training BERT in 76 minutes" (You et
al., 2019), with Adam bias correction and decoupled weight decay inside the trust ratio.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch import nn

from trainium_training.choices import OPTIMIZERS

NO_DECAY_SUFFIXES: Final = ("bias", "LayerNorm.weight", "LayerNorm.bias")
"""Parameters BERT pretraining excludes from weight decay."""


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed weights, and biases and LayerNorm parameters without decay."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        (no_decay if name.endswith(NO_DECAY_SUFFIXES) else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


class _Fp32StateOptimizer(torch.optim.Optimizer):
    """Shared state handling: fp32 moments, a tensor step count, dtype-preserving loading, and
    the step over every parameter with a gradient; a subclass gives its update (`_apply`)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
    ) -> None:
        if lr <= 0.0:
            raise ValueError(f"learning rate must be > 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if eps <= 0.0:
            raise ValueError(f"eps must be > 0, got {eps}")
        if weight_decay < 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def _state_for(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        state: dict[str, torch.Tensor] = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
        return state

    def _moments(
        self, param: torch.Tensor, betas: tuple[float, float]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Update the moments; return the fp32 parameter and bias-corrected moments."""
        assert param.grad is not None
        state = self._state_for(param)
        beta1, beta2 = betas
        grad = param.grad.detach().float()
        step = state["step"]
        step.add_(1.0)
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1.0 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
        bias1 = 1.0 - torch.pow(torch.full_like(step, beta1), step)
        bias2 = 1.0 - torch.pow(torch.full_like(step, beta2), step)
        return param.detach().float(), exp_avg / bias1, exp_avg_sq / bias2

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Like Optimizer.load_state_dict, but the moments stay fp32 on bf16 parameters.

        (The base class casts every state tensor to its parameter's dtype, which would round
        fp32 moments to bf16.)
        """
        groups = self.param_groups
        saved_groups = state_dict["param_groups"]
        if len(groups) != len(saved_groups):
            raise ValueError(
                f"checkpoint optimizer has {len(saved_groups)} parameter groups, "
                f"this model has {len(groups)}"
            )
        id_to_param: dict[int, torch.Tensor] = {}
        for group, saved in zip(groups, saved_groups, strict=True):
            if len(group["params"]) != len(saved["params"]):
                raise ValueError(
                    f"checkpoint optimizer group has {len(saved['params'])} parameters, "
                    f"this model's has {len(group['params'])}: was it written for another "
                    "--model_config?"
                )
            id_to_param.update(zip(saved["params"], group["params"], strict=True))
            for key, value in saved.items():
                if key != "params":
                    group[key] = tuple(value) if key == "betas" else value
        self.state.clear()
        for param_id, saved_state in state_dict["state"].items():
            param = id_to_param[int(param_id)]
            restored = {}
            for key, value in saved_state.items():
                if value.shape not in ((), param.shape):
                    raise ValueError(
                        f"checkpoint optimizer state '{key}' has shape {tuple(value.shape)}, "
                        f"parameter has {tuple(param.shape)}"
                    )
                restored[key] = value.to(device=param.device, dtype=torch.float32)
            self.state[param] = restored

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            raise ValueError("closures are not supported")
        for group in self.param_groups:
            lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                p32, m_hat, v_hat = self._moments(param, group["betas"])
                self._apply(p32, m_hat, v_hat, lr=lr, eps=eps, decay=decay)
                param.copy_(p32)

    def _apply(
        self,
        p32: torch.Tensor,
        m_hat: torch.Tensor,
        v_hat: torch.Tensor,
        *,
        lr: float,
        eps: float,
        decay: float,
    ) -> None:
        """Updates the fp32 parameter `p32` in place from the bias-corrected moments."""
        raise NotImplementedError


class AdamW(_Fp32StateOptimizer):
    """Adam with decoupled weight decay (Loshchilov & Hutter), fp32 state."""

    def _apply(
        self,
        p32: torch.Tensor,
        m_hat: torch.Tensor,
        v_hat: torch.Tensor,
        *,
        lr: float,
        eps: float,
        decay: float,
    ) -> None:
        p32.mul_(1.0 - lr * decay)
        p32.addcdiv_(m_hat, v_hat.sqrt().add_(eps), value=-lr)


class Lamb(_Fp32StateOptimizer):
    """LAMB: the Adam direction plus weight decay, scaled per tensor by ||w|| / ||update||."""

    def _apply(
        self,
        p32: torch.Tensor,
        m_hat: torch.Tensor,
        v_hat: torch.Tensor,
        *,
        lr: float,
        eps: float,
        decay: float,
    ) -> None:
        update = m_hat / (v_hat.sqrt() + eps)
        if decay != 0.0:
            update.add_(p32, alpha=decay)
        weight_norm = torch.linalg.vector_norm(p32)
        update_norm = torch.linalg.vector_norm(update)
        # Ratio 1 when either norm is zero (fresh zero-initialised biases, zero grads).
        usable = (weight_norm > 0) & (update_norm > 0)
        trust = torch.where(usable, weight_norm / torch.where(usable, update_norm, 1.0), 1.0)
        p32.add_(update * (trust * -lr))


def build_optimizer(
    name: str, model: nn.Module, lr: float, weight_decay: float
) -> _Fp32StateOptimizer:
    groups = parameter_groups(model, weight_decay)
    key = name.lower()
    if key == "adamw":
        return AdamW(groups, lr=lr, weight_decay=weight_decay)
    if key == "lamb":
        return Lamb(groups, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"--optimizer {name!r} is unknown; choose one of {', '.join(OPTIMIZERS)}")


@dataclass(frozen=True)
class LinearWarmupDecay:
    """LR multiplier: 0 -> 1 linearly over `warmup_steps`, then linearly to 0 at `total_steps`.

    A dataclass rather than a lambda so LambdaLR can save it in checkpoints.
    """

    warmup_steps: int
    total_steps: int

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        remaining = self.total_steps - step
        span = max(1, self.total_steps - self.warmup_steps)
        return max(0.0, remaining / span)


def build_scheduler(
    optimizer: torch.optim.Optimizer,
    *,
    peak_lr: float,
    warmup_steps: int,
    total_steps: int,
    completed_steps: int = 0,
) -> torch.optim.lr_scheduler.LambdaLR:
    """The warmup/decay schedule positioned after `completed_steps` optimizer steps.

    The learning rate is a pure function of the step and these arguments, so a resumed run
    rebuilds the schedule here rather than loading the saved one (whose saved shape would
    silently override a changed --max_steps or --lr).
    """
    schedule = LinearWarmupDecay(warmup_steps, total_steps)
    if completed_steps == 0:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    for group in optimizer.param_groups:
        group["initial_lr"] = peak_lr
    # LambdaLR's constructor takes one step from `last_epoch`.
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule, last_epoch=completed_steps - 1)

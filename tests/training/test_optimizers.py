"""AdamW and LAMB updates, their fp32 state, weight-decay groups and the LR schedule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from trainium_training.model_configs import build_model
from trainium_training.optimizers import (
    AdamW,
    Lamb,
    LinearWarmupDecay,
    build_scheduler,
    parameter_groups,
)

pytestmark = pytest.mark.training


def fresh_pair(seed: int = 0) -> tuple[nn.Linear, nn.Linear]:
    torch.manual_seed(seed)
    first = nn.Linear(6, 4)
    second = nn.Linear(6, 4)
    second.load_state_dict(first.state_dict())
    return first, second


def train(model: nn.Linear, optimizer: torch.optim.Optimizer, steps: int) -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 6, generator=generator)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def test_our_adamw_matches_torch_adamw_over_several_steps() -> None:
    ours_model, reference_model = fresh_pair()
    train(ours_model, AdamW(ours_model.parameters(), lr=1e-2, eps=1e-6, weight_decay=0.1), 7)
    train(
        reference_model,
        torch.optim.AdamW(reference_model.parameters(), lr=1e-2, eps=1e-6, weight_decay=0.1),
        7,
    )
    for ours, reference in zip(ours_model.parameters(), reference_model.parameters(), strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)


def test_lamb_first_step_matches_the_paper_formula() -> None:
    weight = torch.tensor([[1.0, -2.0], [0.5, 3.0]])
    grad = torch.tensor([[0.1, 0.4], [-0.3, 0.2]])
    param = nn.Parameter(weight.clone())
    param.grad = grad.clone()
    lr, decay, eps, b1, b2 = 0.1, 0.01, 1e-6, 0.9, 0.999
    Lamb([param], lr=lr, betas=(b1, b2), eps=eps, weight_decay=decay).step()

    w, g = weight.numpy().astype(np.float64), grad.numpy().astype(np.float64)
    m_hat = (1 - b1) * g / (1 - b1)
    v_hat = (1 - b2) * g * g / (1 - b2)
    update = m_hat / (np.sqrt(v_hat) + eps) + decay * w
    trust = np.linalg.norm(w) / np.linalg.norm(update)
    expected = w - lr * trust * update
    np.testing.assert_allclose(param.detach().numpy(), expected, rtol=1e-5)


def test_lamb_moves_zero_weights_with_trust_ratio_one() -> None:
    param = nn.Parameter(torch.zeros(3))
    param.grad = torch.tensor([1.0, -1.0, 2.0])
    Lamb([param], lr=0.5, weight_decay=0.0).step()
    # Adam's first step is lr * sign(grad) (up to eps); the trust ratio is 1 for zero weights.
    torch.testing.assert_close(
        param.detach(), torch.tensor([-0.5, 0.5, -0.5]), rtol=1e-4, atol=1e-5
    )


@pytest.mark.parametrize("optimizer_class", [AdamW, Lamb])
def test_state_stays_fp32_for_bf16_parameters_across_save_and_load(optimizer_class: type) -> None:
    param = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    param.grad = torch.full((4,), 1e-3, dtype=torch.bfloat16)
    optimizer = optimizer_class([param], lr=1e-3)
    optimizer.step()
    state = optimizer.state[param]
    assert state["exp_avg"].dtype == torch.float32
    saved = optimizer.state_dict()
    exact = saved["state"][0]["exp_avg_sq"].clone()

    other_param = nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    restored = optimizer_class([other_param], lr=1e-3)
    restored.load_state_dict(saved)
    loaded = restored.state[other_param]
    assert loaded["exp_avg_sq"].dtype == torch.float32
    assert torch.equal(loaded["exp_avg_sq"], exact), "moments were not rounded to bf16"
    assert float(loaded["step"]) == 1.0


def test_loading_state_of_another_model_shape_names_the_mismatch() -> None:
    small, large = nn.Linear(2, 2), nn.Linear(3, 2)
    source = AdamW(small.parameters())
    train_input = torch.randn(1, 2)
    small(train_input).sum().backward()
    source.step()
    with pytest.raises(ValueError, match="has shape"):
        AdamW(large.parameters()).load_state_dict(source.state_dict())


def test_bias_and_layer_norm_parameters_are_not_decayed() -> None:
    model = build_model("tiny")
    decayed, exempt = parameter_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert decayed["weight_decay"] == 0.01
    assert exempt["weight_decay"] == 0.0
    assert all(not names[id(p)].endswith(("bias", "LayerNorm.weight")) for p in decayed["params"])
    assert all(names[id(p)].endswith(("bias", "LayerNorm.weight")) for p in exempt["params"])
    assert len(decayed["params"]) + len(exempt["params"]) == len(list(model.parameters()))


def test_schedule_warms_up_linearly_then_decays_to_zero() -> None:
    schedule = LinearWarmupDecay(warmup_steps=4, total_steps=12)
    assert [schedule(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule(8) == pytest.approx(0.5)
    assert schedule(12) == 0.0
    assert schedule(20) == 0.0


def test_a_schedule_rebuilt_at_step_k_continues_like_the_original() -> None:
    def lrs(completed: int, steps: int) -> list[float]:
        optimizer = AdamW(nn.Linear(2, 2).parameters(), lr=1e-3)
        scheduler = build_scheduler(
            optimizer, peak_lr=1e-3, warmup_steps=3, total_steps=10, completed_steps=completed
        )
        seen = []
        for _ in range(steps):
            seen.append(scheduler.get_last_lr()[0])
            optimizer.step()
            scheduler.step()
        return seen

    assert lrs(completed=4, steps=5) == lrs(completed=0, steps=9)[4:]

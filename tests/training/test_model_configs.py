"""Model shapes defined in code match the published BERT sizes."""

from __future__ import annotations

import pytest
import torch
from transformers import BertForPreTraining

from trainium_training.model_configs import bert_config

pytestmark = pytest.mark.training


@pytest.mark.parametrize(
    ("name", "millions"),
    [("bert-large", 336.2), ("bert-base", 110.1)],
)
def test_named_configs_have_the_published_parameter_counts(name: str, millions: float) -> None:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        model = BertForPreTraining(bert_config(name))
    count = sum(p.numel() for p in model.parameters())
    assert count / 1e6 == pytest.approx(millions, abs=0.1)


def test_an_unknown_config_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="choose one of bert-base, bert-large, tiny"):
        bert_config("bert-huge")

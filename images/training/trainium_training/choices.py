"""The training script's choices, without torch or transformers: the argument parser reads
them before the heavy imports, so `--help` and a bad argument answer at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

DEVICE_CHOICES: Final = ("auto", "xla", "neuron", "cpu")
# torch.compile backends of the native stack. auto: "neuron" on a Neuron device, off on the CPU
# (compiling BERT there costs more than it saves in short runs); eager and aot_eager trace with
# TorchDynamo but run eagerly, inductor generates CPU code.
COMPILE_BACKEND_CHOICES: Final = ("auto", "off", "neuron", "eager", "aot_eager", "inductor")
OPTIMIZERS: Final = ("adamw", "lamb")


@dataclass(frozen=True)
class BertShape:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    dropout: float = 0.1


MODEL_CONFIGS: Final[dict[str, BertShape]] = {
    "bert-large": BertShape(30522, 1024, 24, 16, 4096, 512),
    "bert-base": BertShape(30522, 768, 12, 12, 3072, 512),
    "tiny": BertShape(1024, 64, 2, 2, 128, 128),
}
DEFAULT_MODEL_CONFIG: Final = "bert-large"

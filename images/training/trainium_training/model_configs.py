"""BERT shapes defined in code, so nothing is downloaded at run time (no model hub).

`bert-large` and `bert-base` match the published uncased BERT configurations (vocabulary of
30,522 WordPiece tokens, 512 positions, GELU, LayerNorm eps 1e-12, init std 0.02); the model
is initialised from scratch, as phase-1 pretraining does. `tiny` keeps the architecture at a
size that trains on a laptop CPU in seconds, for tests.
"""

from __future__ import annotations

from transformers import BertConfig, BertForPreTraining

from trainium_training.choices import MODEL_CONFIGS


def bert_config(name: str, attn_implementation: str = "eager") -> BertConfig:
    """The transformers config for a named shape; no files are read."""
    try:
        shape = MODEL_CONFIGS[name]
    except KeyError:
        known = ", ".join(sorted(MODEL_CONFIGS))
        raise ValueError(f"--model_config {name!r} is unknown; choose one of {known}") from None
    return BertConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        intermediate_size=shape.intermediate_size,
        max_position_embeddings=shape.max_position_embeddings,
        type_vocab_size=2,
        hidden_act="gelu",
        hidden_dropout_prob=shape.dropout,
        attention_probs_dropout_prob=shape.dropout,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        pad_token_id=0,
        # Eager attention gives the same graph on every backend; the Neuron compiler's
        # transformer tuning was done on it (the tutorial predates SDPA in transformers).
        attn_implementation=attn_implementation,
    )


def build_model(name: str, attn_implementation: str = "eager") -> BertForPreTraining:
    """A freshly initialised BertForPreTraining (seed the RNG first for identical ranks)."""
    return BertForPreTraining(bert_config(name, attn_implementation))

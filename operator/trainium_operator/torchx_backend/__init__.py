"""The TorchX scheduler backend `trainium` (needs the `torchx` extra)."""

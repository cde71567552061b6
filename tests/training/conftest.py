"""The training tests need the `training` extra (torch, transformers, h5py, tensorboard)."""

from __future__ import annotations

import pytest

for _module in ("torch", "transformers", "h5py", "tensorboard"):
    pytest.importorskip(_module, reason="the training extra is not installed")

"""A device-activity source on torch.profiler (Kineto); filled in below."""

from __future__ import annotations

from trainium_operator.profiler.sources.base import ActivitySource, SourceContext


def create(context: SourceContext) -> ActivitySource | None:
    """The torch source, or None when torch is not importable or no step window is set."""
    return None

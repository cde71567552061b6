"""A device-activity source on the Neuron runtime's system/device profiles; filled in below."""

from __future__ import annotations

from trainium_operator.profiler.sources.base import ActivitySource, SourceContext


def create(context: SourceContext) -> ActivitySource | None:
    """The Neuron source, or None when the Neuron runtime inspection is not configured."""
    return None

"""Device activity sources: each turns another profiler's output into our events."""

from trainium_operator.profiler.sources.base import ActivitySource, SourceBatch, SourceContext

__all__ = ["ActivitySource", "SourceBatch", "SourceContext"]

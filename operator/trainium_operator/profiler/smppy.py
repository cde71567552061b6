"""SageMaker Profiler's pre-December-2023 package name: `import ... smppy as smprof` works too."""

from trainium_operator.profiler.smprof import (
    Config,
    SMProfiler,
    annotate,
    annotation_begin,
    annotation_end,
    install_aliases,
)

__all__ = [
    "Config",
    "SMProfiler",
    "annotate",
    "annotation_begin",
    "annotation_end",
    "install_aliases",
]

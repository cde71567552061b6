"""SageMaker Profiler's pre-December-2023 package name: `import ... smppy as smprof` works too."""

from trainium_operator.profiler import smprof
from trainium_operator.profiler.smprof import *  # noqa: F403 - the same names as smprof

__all__ = smprof.__all__

"""SageMaker Profiler compatibility: scripts written for `smprof` / `smppy` run unchanged.

    import trainium_operator.profiler.smprof as smprof   # instead of `import smprof`

    SMProf = smprof.SMProfiler.instance()
    config = smprof.Config()
    config.profiler = {"EnableCuda": "1"}
    SMProf.configure(config)
    SMProf.start_profiling()
    for i, batch in enumerate(loader):
        with smprof.annotate("step_" + str(i)):
            with smprof.annotate("Forward"):
                ...
        # or: h = smprof.annotation_begin("step_" + str(i)) ... smprof.annotation_end(h)
    SMProf.stop_profiling()

`install_aliases()` registers this module as `smprof` and `smppy` in `sys.modules`, so even
the `import smprof` line can stay (call it from a sitecustomize or a launcher before the
script imports).

Differences, by design: whether profiling runs is decided by our environment
(`TRAINIUM_PROFILE=1` ..., set by the operator), not by SageMaker's estimator config; the
`config.profiler` keys (`EnableCuda`, ...) are accepted and ignored. SageMaker has no step API:
an annotation named `step_<n>` (the name its docs use) also marks step n, so the step-time
histogram works for such scripts.
"""

from __future__ import annotations

import re
import sys
from types import ModuleType

from trainium_operator.profiler import capture
from trainium_operator.profiler.config import ProfilerConfig

_STEP_NAME = re.compile(r"^step[_\s#-]?(\d+)$", re.IGNORECASE)


def step_number(name: str) -> int | None:
    """n for an annotation named like `step_<n>`, else None."""
    match = _STEP_NAME.match(name)
    return int(match.group(1)) if match else None


class Config:
    """SageMaker's `smprof.Config`: `profiler` options are kept but do not change capture."""

    def __init__(self) -> None:
        self.profiler: dict[str, str] = {}


class SMProfiler:
    """SageMaker's process-wide profiler object (`SMProfiler.instance()`)."""

    _instance: SMProfiler | None = None

    def __init__(self) -> None:
        self.config = Config()
        self.profiler_config: ProfilerConfig | None = None

    @classmethod
    def instance(cls) -> SMProfiler:
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    def configure(self, config: Config) -> None:
        self.config = config

    def start_profiling(self) -> None:
        capture.start_profiling(self.profiler_config)

    def stop_profiling(self) -> None:
        capture.stop_profiling()


class annotate(capture.Annotation):  # noqa: N801 - SageMaker's name
    """`with smprof.annotate(name):` (also usable as a decorator); `step_<n>` also marks step n."""

    __slots__ = ()

    def __enter__(self) -> annotate:
        number = step_number(self.name)
        if number is not None:
            capture.step(number)
        super().__enter__()
        return self


def annotation_begin(name: str) -> capture.AnnotationHandle:
    number = step_number(name)
    if number is not None:
        capture.step(number)
    return capture.annotation_begin(name)


def annotation_end(handle: capture.AnnotationHandle) -> None:
    capture.annotation_end(handle)


def install_aliases() -> None:
    """Make `import smprof` and `import smppy` resolve to this module."""
    module: ModuleType = sys.modules[__name__]
    sys.modules.setdefault("smprof", module)
    sys.modules.setdefault("smppy", module)


__all__ = [
    "Config",
    "SMProfiler",
    "annotate",
    "annotation_begin",
    "annotation_end",
    "install_aliases",
]

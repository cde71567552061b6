"""Low-overhead profiler for training ranks: host annotations, step markers, device activity.

    from trainium_operator import profiler

    profiler.start_profiling()            # reads TRAINIUM_PROFILE* / RANK ... from the env
    for i, batch in enumerate(loader):
        profiler.step(i)
        with profiler.annotate("forward"):
            loss = model(batch)
        profiler.report(samples=len(batch))  # optional: throughput in the job's status
        if i % 500 == 0:
            save(model)
            profiler.checkpoint_saved(i)  # optional: the work a restart loses (status.goodput)
    profiler.stop_profiling()             # returns at once; a background thread writes the file

Everything is a cheap no-op while profiling is off. This package imports nothing else from
trainium_operator, nor kopf/kubernetes, and imports torch only lazily (torch source).
"""

from trainium_operator.profiler.capture import (
    Annotation,
    AnnotationHandle,
    annotate,
    annotation_begin,
    annotation_end,
    background_cpu_ns,
    current_config,
    is_capturing_detail,
    is_enabled,
    start_profiling,
    step,
    stop_profiling,
    wait_for_flush,
)
from trainium_operator.profiler.channel import checkpoint_saved, report
from trainium_operator.profiler.config import ProfilerConfig, ProfilerConfigError, StepWindow

__all__ = [
    "Annotation",
    "AnnotationHandle",
    "ProfilerConfig",
    "ProfilerConfigError",
    "StepWindow",
    "annotate",
    "annotation_begin",
    "annotation_end",
    "background_cpu_ns",
    "checkpoint_saved",
    "current_config",
    "is_capturing_detail",
    "is_enabled",
    "report",
    "start_profiling",
    "step",
    "stop_profiling",
    "wait_for_flush",
]

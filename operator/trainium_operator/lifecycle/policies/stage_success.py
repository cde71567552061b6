"""Stage success: a compile gang that all succeeded starts training (with what it left in the
NEFF cache on the native stack); a training gang that all succeeded ends the job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainium_operator.api.spec import NeuronStack
from trainium_operator.api.status import ConditionType, Phase
from trainium_operator.builders.job import Stage
from trainium_operator.lifecycle.cleanup import cleanup_on_finish
from trainium_operator.lifecycle.compile_cache import compile_cache_view
from trainium_operator.lifecycle.decision import EventRecord
from trainium_operator.lifecycle.status_edit import dump, workers_view

if TYPE_CHECKING:
    from trainium_operator.lifecycle.snapshot import Pass

COMPILED_MESSAGES = {
    NeuronStack.XLA: "neuron_parallel_compile filled the compile cache",
    NeuronStack.NATIVE: "the compile steps filled the persistent NEFF cache",
}


def stage_success(p: Pass) -> None:
    job, status, stage = p.job, p.status, p.stage
    gang = p.observed.gang(stage, p.attempt)
    done = (
        gang
        and len(gang) == job.spec.nodes
        and all(pod.phase == "Succeeded" for pod in gang.values())
    )
    if not done:
        if stage is Stage.COMPILE:
            status.condition(ConditionType.COMPILED, False, "Compiling", "compile stage running")
        return
    status.mark_stage(stage, "completionTime")
    if stage is Stage.TRAIN:
        status.workers = workers_view(gang, job.spec.nodes)
        status.finish(
            Phase.SUCCEEDED, "TrainingSucceeded", f"all {job.spec.nodes} training pods succeeded"
        )
        cleanup_on_finish(job, p.plan, p.observed)
        p.settle()
        return
    message = COMPILED_MESSAGES[job.spec.effective_neuron_stack]
    if job.spec.effective_neuron_stack is NeuronStack.NATIVE:
        cache = compile_cache_view(job, gang)
        status.data.setdefault("compile", {})["cache"] = dump(cache)
        message += f": {cache.summary or cache.message}"
    status.condition(ConditionType.COMPILED, True, "CompileSucceeded", message)
    p.plan.events.append(
        EventRecord("Normal", "CompileSucceeded", "compile stage finished; starting training")
    )
    p.stage = Stage.TRAIN

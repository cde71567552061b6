"""A script written for SageMaker Profiler runs unchanged on ours."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from profiler.profiler_helpers import make_config, of_kind, ranges_by_name, stop_and_read
from trainium_operator.profiler import smprof
from trainium_operator.profiler.events import EventKind

# The usage shown in AWS's "Prepare and run a training job with SageMaker Profiler" page,
# including its import fallback, untouched.
SAGEMAKER_SCRIPT = textwrap.dedent(
    """
    try:
        import smprof
    except ImportError:
        import smppy as smprof

    SMProf = smprof.SMProfiler.instance()
    config = smprof.Config()
    config.profiler = {"EnableCuda": "1"}
    SMProf.configure(config)
    SMProf.start_profiling()

    for epoch in range(1):
        for i in range(4):
            step_annotation = smprof.annotation_begin("step_" + str(i))
            with smprof.annotate("Forward"):
                pass
            with smprof.annotate("Backward"):
                pass
            smprof.annotation_end(step_annotation)

    SMProf.stop_profiling()
    """
)

LAUNCHER = (
    "import sys\n"
    "from trainium_operator.profiler.smprof import install_aliases\n"
    "install_aliases()\n"
    "exec(compile(open(sys.argv[1]).read(), sys.argv[1], 'exec'), {'__name__': '__main__'})\n"
)


def test_unmodified_sagemaker_script_produces_a_profile(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SAGEMAKER_SCRIPT)
    env = {
        **os.environ,
        "TRAINIUM_PROFILE": "1",
        "TRAINIUM_PROFILE_DIR": str(tmp_path / "profile"),
        "TRAINIUM_NODE_NAME": "n1",
        "TRAINIUM_PROFILE_SOURCES": "none",
    }
    subprocess.run([sys.executable, "-c", LAUNCHER, str(script)], env=env, check=True, timeout=120)

    from trainium_operator.profiler.format import read_rank_file

    events = read_rank_file(tmp_path / "profile" / "n1" / "rank-0.trnprof").events
    found = ranges_by_name(events)
    assert len(found["Forward"]) == 4
    assert len(found["Backward"]) == 4
    assert [f"step_{i}" in found for i in range(4)] == [True] * 4
    # step_<n> annotations double as step markers, so step times are known.
    assert sorted(e.value for e in of_kind(events, EventKind.STEP)) == [0, 1, 2, 3]


def test_sagemaker_names_drive_our_profiler_in_process(tmp_path: Path) -> None:
    prof = smprof.SMProfiler.instance()
    assert prof is smprof.SMProfiler.instance()
    prof.profiler_config = make_config(tmp_path)
    try:
        prof.start_profiling()

        @smprof.annotate("decorated")
        def work() -> int:
            return 3

        with smprof.annotate("Step 7"):
            assert work() == 3
        result = stop_and_read(tmp_path / "node-a" / "rank-0.trnprof")
    finally:
        prof.profiler_config = None
    assert len(ranges_by_name(result.events)["decorated"]) == 1
    assert [e.value for e in of_kind(result.events, EventKind.STEP)] == [7]


def test_step_numbers_are_read_only_from_step_names() -> None:
    assert [smprof.step_number(n) for n in ("step_12", "Step 3", "step#4", "stepper_1", "x")] == [
        12,
        3,
        4,
        None,
        None,
    ]

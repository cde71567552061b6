"""Flags the operator adds to the training script's command line.

The training script (images/training/trainium_training) parses exactly these names, and a
test checks that it does, so the operator and the workload cannot drift apart.
"""

from __future__ import annotations

DATA_DIR_FLAG = "--data_dir"
OUTPUT_DIR_FLAG = "--output_dir"
STEPS_THIS_RUN_FLAG = "--steps_this_run"  # compile stage: steps run under neuron_parallel_compile
RESUME_FLAG = "--resume"  # every attempt after the first: continue from the newest checkpoint

OPERATOR_FLAGS = (DATA_DIR_FLAG, OUTPUT_DIR_FLAG, STEPS_THIS_RUN_FLAG, RESUME_FLAG)

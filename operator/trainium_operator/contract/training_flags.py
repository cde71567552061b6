"""Flags of our BERT pretraining script (images/training/trainium_training) that a job can
opt into: the operator adds none of them by itself.

The example job (examples/bert-large-pretrain.yaml) names them in spec.command.dataDirArg,
outputDirArg, resumeArgs and spec.compile.stepsArg; the script parses exactly these names,
and a test checks that it parses the commands the operator builds for that job, so the
example and the workload cannot drift apart. What every container gets regardless of
flags is the environment in `workload_env`.
"""

from __future__ import annotations

DATA_DIR_FLAG = "--data_dir"
OUTPUT_DIR_FLAG = "--output_dir"
STEPS_THIS_RUN_FLAG = "--steps_this_run"  # compile stage: steps run under neuron_parallel_compile
RESUME_FLAG = "--resume"  # every attempt after the first: continue from the newest checkpoint

OPERATOR_FLAGS = (DATA_DIR_FLAG, OUTPUT_DIR_FLAG, STEPS_THIS_RUN_FLAG, RESUME_FLAG)

"""Command-line contract: the operator's flags parse, bad values fail with every problem named."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from training.training_helpers import PRETRAIN, REPO, child_env, run
from trainium_operator.contract import training_flags
from trainium_training.arguments import PRECISION_ENV, build_parser, parse_arguments

pytestmark = pytest.mark.training

REQUIRED = ["--data_dir", "/data/shards"]

# A sample value for each flag the operator appends; a new flag in training_flags must be added
# here (the first test fails until it is), so the script cannot silently miss it.
OPERATOR_FLAG_VALUES: dict[str, list[str]] = {
    training_flags.DATA_DIR_FLAG: ["/fsx/data"],
    training_flags.OUTPUT_DIR_FLAG: ["/fsx/output/job"],
    training_flags.STEPS_THIS_RUN_FLAG: ["10"],
    training_flags.RESUME_FLAG: [],
}


def test_every_operator_flag_has_a_sample_value_here() -> None:
    assert set(training_flags.OPERATOR_FLAGS) == set(OPERATOR_FLAG_VALUES)


def test_the_parser_accepts_every_flag_the_operator_appends() -> None:
    argv = ["--batch_size", "16"]
    for flag in training_flags.OPERATOR_FLAGS:
        argv += [flag, *OPERATOR_FLAG_VALUES[flag]]
    _namespace, unknown = build_parser({}).parse_known_args(argv)
    assert unknown == []
    args = parse_arguments(argv, {})
    assert args.data_dir == Path("/fsx/data")
    assert args.output_dir == Path("/fsx/output/job")
    assert args.steps_this_run == 10
    assert args.resume is True


def test_operator_flags_appended_after_user_args_override_user_defaults() -> None:
    """The operator puts its flags last; argparse keeps the last value of a repeated flag."""
    args = parse_arguments(
        [*REQUIRED, "--output_dir", "/user/out", training_flags.OUTPUT_DIR_FLAG, "/fsx/out"], {}
    )
    assert args.output_dir == Path("/fsx/out")


def test_defaults_follow_the_reference_tutorial() -> None:
    args = parse_arguments(REQUIRED, {})
    assert (args.batch_size, args.grad_accum_usteps, args.max_steps) == (8, 64, 28125)
    assert (args.warmup_steps, args.lr, args.seed) == (2000, 4e-4, 12349)
    assert (args.model_config, args.optimizer, args.steps_this_run) == ("bert-large", "adamw", -1)
    assert args.resume is False


def test_optimizer_names_are_case_insensitive() -> None:
    assert parse_arguments([*REQUIRED, "--optimizer", "LAMB"], {}).optimizer == "lamb"


def test_precision_defaults_to_the_operator_environment_and_the_flag_wins() -> None:
    assert parse_arguments(REQUIRED, {PRECISION_ENV: "fp32"}).precision == "fp32"
    assert (
        parse_arguments([*REQUIRED, "--precision", "bf16"], {PRECISION_ENV: "fp32"}).precision
        == "bf16"
    )
    assert parse_arguments(REQUIRED, {}).precision == "auto"


def test_bad_values_fail_with_every_problem_listed(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        *REQUIRED,
        "--batch_size",
        "0",
        "--steps_this_run",
        "0",
        "--lr",
        "-1",
        "--max_steps",
        "0",
    ]
    with pytest.raises(SystemExit) as caught:
        parse_arguments(argv, {})
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--batch_size must be >= 1 (got 0)" in err
    assert "--steps_this_run must be -1 (run to --max_steps) or >= 1 (got 0)" in err
    assert "--lr must be > 0 (got -1.0)" in err
    assert "--max_steps must be >= 1 (got 0)" in err


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        pytest.param([], {}, "the following arguments are required: --data_dir", id="no-data-dir"),
        pytest.param(
            [*REQUIRED, "--model_config", "gpt"], {}, "invalid choice: 'gpt'", id="unknown-model"
        ),
        pytest.param(
            [*REQUIRED, "--seq_len", "4096", "--model_config", "tiny"],
            {},
            "--seq_len must be in [2, 128] for --model_config tiny (got 4096)",
            id="seq-len-beyond-model",
        ),
        pytest.param(
            REQUIRED,
            {PRECISION_ENV: "fp8"},
            f"--precision (or ${PRECISION_ENV}) must be one of auto, bf16, fp32 (got 'fp8')",
            id="bad-precision-env",
        ),
        pytest.param(
            [*REQUIRED, "--batch_size", "eight"], {}, "invalid int value: 'eight'", id="not-int"
        ),
    ],
)
def test_each_bad_input_names_the_flag(
    argv: list[str], environ: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_arguments(argv, environ)
    assert message in capsys.readouterr().err


def test_an_output_dir_that_is_a_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    occupied = tmp_path / "out"
    occupied.write_text("")
    with pytest.raises(SystemExit):
        parse_arguments([*REQUIRED, "--output_dir", str(occupied)], {})
    assert f"--output_dir {occupied} exists and is not a directory" in capsys.readouterr().err


def test_the_script_runs_as_a_file_and_reports_bad_arguments() -> None:
    """torchrun executes pretrain.py by path; its package imports must work that way, and a bad
    argument is refused before torch is imported (the e2e runs import the rest by path)."""
    result = run(
        [sys.executable, str(PRETRAIN), "--data_dir", "/x", "--grad_accum_usteps", "0"], child_env()
    )
    assert result.returncode == 2
    assert "pretrain.py: error: --grad_accum_usteps must be >= 1 (got 0)" in result.stderr
    assert "Traceback" not in result.stderr


def test_what_the_script_imports_from_the_operator_package_needs_no_third_party_module() -> None:
    """The training image copies these modules of ours alone, without the operator's
    dependencies (no pydantic, kopf or kubernetes there), so they must stay standard-library
    only."""
    probe = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import trainium_operator.contract.training_flags\n"
        "import trainium_operator.contract.workload_env\n"
        "import trainium_operator.profiler\n"
        "tops = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(t for t in tops if t not in sys.stdlib_module_names))\n"
    )
    result = run([sys.executable, "-c", probe], child_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['trainium_operator']"


@pytest.mark.parametrize(("stage_name", "attempt"), [("compile", 0), ("train", 0), ("train", 1)])
def test_the_commands_the_operator_builds_for_the_example_job_parse(
    stage_name: str, attempt: int
) -> None:
    """End to end on the contract: the operator's own builder, the shipped example job."""
    yaml = pytest.importorskip("yaml")
    from trainium_operator.api.spec import TrainingJobSpec
    from trainium_operator.builders.job import JobRef, Stage
    from trainium_operator.builders.pods import torchrun_command

    document = yaml.safe_load((REPO / "examples" / "bert-large-pretrain.yaml").read_text())
    spec = TrainingJobSpec.model_validate(document["spec"])
    job = JobRef(name="bert-large-pretrain", namespace="ml", uid="u-1", generation=1, spec=spec)
    command = torchrun_command(job, Stage(stage_name), attempt)
    script_args = command[command.index(spec.command.script) + 1 :]

    args = parse_arguments(script_args, {})

    assert args.data_dir == Path(job.data_dir)
    assert args.output_dir == Path(job.output_dir(Stage(stage_name), attempt))
    assert (args.batch_size, args.grad_accum_usteps) == (16, 32)
    assert args.steps_this_run == (spec.compile.steps if stage_name == "compile" else -1)
    assert args.resume is (attempt > 0)

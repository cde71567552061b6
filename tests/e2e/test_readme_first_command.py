"""The README's first command, run as a newcomer would: in a fresh clone, verbatim."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The shell blocks of the README, in order."""
    text = (ROOT / "README.md").read_text()
    return [block.strip() for block in re.findall(r"```sh\n(.*?)```", text, flags=re.S)]


def test_readme_starts_with_the_demo_and_the_test_commands() -> None:
    demo, tests = readme_commands()[:2]
    assert demo.endswith("trainium-operator dev demo")
    assert tests.endswith("pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    pytest_command = tests.split("&&")[-1].strip()
    runs = [line for line in ci.splitlines() if line.startswith(pytest_command)]
    assert len(runs) == 1, ".ci/run calls the README's test command once"
    assert " -m " not in runs[0], ".ci/run deselects no tier"


@pytest.mark.e2e
def test_readme_first_command_runs_the_tutorial_job_to_success_in_a_fresh_clone(
    tmp_path: Path,
) -> None:
    clone = tmp_path / "trainium-operator"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    # The working tree, not only what is committed, so the test checks the code under test.
    copy_changes = (
        f"cd {ROOT} && git ls-files -z -m -o --exclude-standard | "
        f"xargs -0 -r -I{{}} cp --parents {{}} {clone}/"
    )
    subprocess.run(["bash", "-c", copy_changes], check=True)
    command = readme_commands()[0]
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("VIRTUAL_ENV", "PYTHON", "KUBECONFIG", "TRAINIUM_PROFILE"))
    }
    # A cluster name of its own; the binary cache stays shared so the Go build is not redone.
    env["TRAINIUM_DEV_CLUSTER"] = f"readme-{uuid.uuid4().hex[:6]}"
    try:
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=clone,
            env=env,
            capture_output=True,
            text=True,
            timeout=1500,
            check=False,
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-6000:]
        assert re.search(r"bert-large-pretrain\s+Compiling", output), output[-6000:]
        assert re.search(r"bert-large-pretrain\s+Training", output), output[-6000:]
        assert re.search(r"bert-large-pretrain\s+Succeeded\s+2\s", output), output[-6000:]
        # Live health while it trains: STEP (of health.totalSteps), RATE and ETA filled in from
        # the ranks' reports on the operator's health channel, as the step advances.
        live = re.findall(
            r"^bert-large-pretrain\s+Training\s+2\s+\S+\s+\S+\s+\d+\s+(\d+)/300\s+"
            r"[0-9.]+ steps/s\s+\d+[smh]",
            output,
            re.M,
        )
        assert live, output[-6000:]
        assert int(live[0]) < 300, output[-6000:]
        assert "Where to look next" in output
        # PodGroups whose status the real Volcano wrote, and no Python scheduler anywhere.
        podgroup_rows = re.findall(
            r"^bert-large-pretrain-(?:compile|train)\s+(\w+)\s.*$", output, re.M
        )
        assert "Running" in podgroup_rows, output[-6000:]
        assert re.search(r"^bert-large-pretrain-train\s.*vc-scheduler", output, re.M), output[
            -6000:
        ]
        # The demo keeps its cluster: its Volcano processes run now, and no Python scheduler.
        processes = subprocess.run(
            ["ps", "-ww", "-eo", "args"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        cluster_name = env["TRAINIUM_DEV_CLUSTER"]
        ours = [p for p in processes if f"/clusters/{cluster_name}/" in p]
        assert any("vc-scheduler" in p for p in ours), ours
        assert any("vc-controller-manager" in p for p in ours), ours
        assert not [p for p in processes if "gang_scheduler" in p]
        assert "Steps (300 with markers" in output, "the profile summary of the real CPU run"
    finally:
        cli = clone / ".venv" / "bin" / "trainium-operator"
        if cli.exists():  # a failed bootstrap leaves none; its error is the one to report
            subprocess.run([str(cli), "dev", "down"], env=env, capture_output=True, check=False)
        # The clone's environment is several GB; pytest would keep it among its last temp dirs.
        shutil.rmtree(clone / ".venv", ignore_errors=True)

"""The shell wrapper of a neuronDeviceProfile training container, run with a real /bin/sh: it
passes SIGTERM on to torchrun, waits for it, merges the device profile and keeps its exit code."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainium_operator.builders.pods import NEURON_PROFILE_MERGE_SCRIPT

# Stands in for torchrun: writes that it started, then exits 143 on SIGTERM (or 3 on its own).
CHILD = """
import signal, sys, time, pathlib
marks = pathlib.Path(sys.argv[1])
def on_term(*_):
    (marks / "terminated").write_text("yes")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
(marks / "started").write_text("yes")
time.sleep(float(sys.argv[2]))
sys.exit(3)
"""


def start(tmp_path: Path, seconds: float) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TRAINIUM_PROFILE_DIR": str(tmp_path / "profile"),
        "TRAINIUM_NODE_NAME": "n0",
    }
    return subprocess.Popen(
        [
            "/bin/sh",
            "-c",
            NEURON_PROFILE_MERGE_SCRIPT,
            "sh",
            sys.executable,
            "-c",
            CHILD,
            str(tmp_path),
            str(seconds),
        ],
        env=env,
    )


def wait_for_file(path: Path) -> None:
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


def test_sigterm_reaches_the_training_process_and_its_exit_code_is_kept(tmp_path: Path) -> None:
    shell = start(tmp_path, seconds=60)
    wait_for_file(tmp_path / "started")
    sent = time.monotonic()
    shell.send_signal(signal.SIGTERM)
    assert shell.wait(timeout=20) == 143
    assert (tmp_path / "terminated").exists(), "the training process never saw SIGTERM"
    assert time.monotonic() - sent < 15, "the shell waited for the grace period"


def test_without_a_signal_the_training_exit_code_is_the_containers(tmp_path: Path) -> None:
    shell = start(tmp_path, seconds=0)
    assert shell.wait(timeout=30) == 3
    assert not (tmp_path / "terminated").exists()

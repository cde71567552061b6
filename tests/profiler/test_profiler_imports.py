"""The profiler stays importable in a training image: no kopf, kubernetes, torch or our layers."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_profiler_pulls_in_nothing_heavy() -> None:
    code = (
        "import sys\n"
        "import trainium_operator.profiler, trainium_operator.profiler.format\n"
        "import trainium_operator.profiler.manifest, trainium_operator.profiler.smprof\n"
        "import trainium_operator.profiler.sources.neuron\n"
        "import trainium_operator.profiler.s3, trainium_operator.contract.profiler_env\n"
        "from trainium_operator import profiler\n"
        "profiler.start_profiling()\n"  # off: TRAINIUM_PROFILE is unset
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in"
        " {'torch', 'kopf', 'kubernetes', 'numpy', 'aiohttp', 'pydantic', 'boto3'}"
        " or m.startswith(('trainium_operator.api', 'trainium_operator.analysis',"
        " 'trainium_operator.k8s', 'trainium_operator.builders')))\n"
        "print(','.join(bad))\n"
    )
    env = {"PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=env
    )
    assert out.stdout.strip() == ""

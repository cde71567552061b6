"""Writes what checkov scans into a directory: the chart rendered with default values and with
the profile UI, the tutorial job's objects as `trainium-operator render` prints them, and that
job's profile upload pod (render has no cluster, so no finished attempt and no upload pod).

Usage: .venv/bin/python .ci/checkov/objects.py HELM OUT_DIR
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import yaml

from trainium_operator.builders.upload import UploadPodSettings, upload_pod
from trainium_operator.lifecycle.parse import parse_job

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "trainium-operator"
EXAMPLE = ROOT / "examples" / "bert-large-pretrain.yaml"
# The tutorial job in a team namespace, as a platform runs it (render keeps the manifest's).
NAMESPACE = "ml-team"


def main(helm: str, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    chart = [helm, "template", "trn", str(CHART), "--namespace", "trainium-system"]
    (out / "chart-default.yaml").write_text(subprocess.check_output(chart, text=True))
    ui = subprocess.check_output([*chart, "--set", "profileUI.enabled=true"], text=True)
    (out / "chart-profile-ui.yaml").write_text(ui)

    job = yaml.safe_load(EXAMPLE.read_text())
    job["metadata"]["namespace"] = NAMESPACE
    render = [sys.executable, "-m", "trainium_operator", "render", "-f", "-"]
    rendered = subprocess.check_output(render, input=yaml.safe_dump(job), text=True)
    (out / "training-job.yaml").write_text(rendered)

    job["metadata"]["uid"] = str(uuid.uuid5(uuid.NAMESPACE_URL, "checkov"))
    ref = parse_job(job)
    assert not isinstance(ref, list), ref
    s3_uri = ref.spec.profile.s3_uri or "s3://my-bucket/profiles"
    settings = UploadPodSettings(
        image="trainium-operator@sha256:" + "0" * 64, service_account="trn-profile-upload"
    )
    pod = upload_pod(ref, 0, s3_uri, settings)
    (out / "upload-pod.yaml").write_text(yaml.safe_dump(pod, sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))

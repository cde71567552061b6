"""Reads checkov's JSON report (one run over every group's files, to start checkov once) and
fails on any failed check that the file's group does not list with its reason.

Groups and their skip lists: chart.yaml (the chart), training.yaml (the tutorial job's
rendered objects), upload.yaml (its profile upload pod). Usage: check.py REPORT.json
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
GROUP_OF_FILE = {
    "chart-default.yaml": "chart",
    "chart-profile-ui.yaml": "chart",
    "training-job.yaml": "training",
    "upload-pod.yaml": "upload",
}


def skip_list(group: str) -> set[str]:
    config = yaml.safe_load((HERE / f"{group}.yaml").read_text())
    return set(config["skip-check"])


def main(report_path: Path) -> int:
    loaded = json.loads(report_path.read_text())
    reports = loaded if isinstance(loaded, list) else [loaded]
    skips = {group: skip_list(group) for group in set(GROUP_OF_FILE.values())}
    passed = failed = 0
    ruled_out: Counter[tuple[str, str]] = Counter()
    unexpected: list[str] = []
    for report in reports:
        passed += report["summary"]["passed"]
        for check in report["results"]["failed_checks"]:
            failed += 1
            group = GROUP_OF_FILE[Path(check["file_path"]).name]
            if check["check_id"] in skips[group]:
                ruled_out[(group, check["check_id"])] += 1
            else:
                unexpected.append(
                    f"{check['check_id']} {check['check_name']}: {check['resource']} "
                    f"({Path(check['file_path']).name})"
                )
    print(f"checkov: {passed + failed} checks, {passed} passed, {failed} failed")
    for (group, check_id), count in sorted(ruled_out.items()):
        print(f"  ruled out ({group}.yaml): {check_id} x{count}")
    for line in unexpected:
        print(f"  FAILED: {line}")
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

"""The README is one screen plus an index: its job is valid and its links lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from trainium_operator.api.spec import TrainingJobSpec

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_stays_under_200_lines() -> None:
    assert len(README.splitlines()) < 200


def test_readme_training_job_is_a_valid_spec() -> None:
    (block,) = re.findall(r"```yaml\n(.*?)```", README, flags=re.S)
    document = yaml.safe_load(block)
    assert document["kind"] == "TrainingJob"
    spec = TrainingJobSpec.model_validate(document["spec"])
    assert spec.nodes == 2


def test_readme_links_point_at_files_in_the_repository() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    assert targets
    for target in targets:
        assert (ROOT / target).exists(), target


def test_readme_indexes_every_docs_page_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)", README))
    for page in re.findall(r":\s+([\w-]+\.md)$", nav, flags=re.M):
        if page != "index.md":
            assert page in linked, page

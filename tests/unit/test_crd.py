from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from click.testing import CliRunner

from trainium_operator.api.crd import training_job_crd
from trainium_operator.cli import main

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "trainium.dev_trainingjobs.yaml"


def walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        found += walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        found += walk(schema["items"], f"{path}[]")
    return found


def test_committed_crd_is_the_generated_one() -> None:
    result = CliRunner().invoke(main, ["render", "--crd"])
    assert result.exit_code == 0, result.output
    assert CRD_FILE.read_text() == result.output, "run: trainium-operator render --crd > " + str(
        CRD_FILE.relative_to(ROOT)
    )


def test_crd_schema_is_structural_and_documents_every_spec_field() -> None:
    spec = training_job_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    for path, node in walk(spec):
        assert "$ref" not in node, path
        assert "anyOf" not in node, path
        assert "type" in node, f"spec{path} has no type"
        if path and not path.endswith("[]"):
            assert node.get("description"), f"spec{path} has no description"


def test_crd_has_status_subresource_short_name_and_printer_columns() -> None:
    version = training_job_crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert training_job_crd()["spec"]["names"]["shortNames"] == ["tj"]
    columns = {c["name"]: c for c in version["additionalPrinterColumns"]}
    assert {"Phase", "Nodes", "Workers", "Restarts", "Age", "Reason"} <= set(columns)
    assert [c["jsonPath"] for name, c in columns.items() if name in {"Step", "Rate", "ETA"}] == [
        ".status.progress.stepSummary",
        ".status.progress.rateSummary",
        ".status.progress.etaSummary",
    ]
    assert columns["Reason"]["priority"] == 1


EXAMPLE = str(ROOT / "examples/bert-large-pretrain.yaml")


def _headed_documents(output: str) -> list[tuple[str, str, str]]:
    """(stage header, kind, name) of each rendered document."""
    found = []
    for chunk in output.split("---\n"):
        header = chunk.splitlines()[0]
        obj = yaml.safe_load(chunk)
        found.append((header, obj["kind"], obj["metadata"]["name"]))
    return found


def test_render_prints_every_stage_labelled_in_apply_order() -> None:
    result = CliRunner().invoke(main, ["render", "-f", EXAMPLE])
    assert result.exit_code == 0, result.output
    kinds = [(o["kind"], o["metadata"]["name"]) for o in yaml.safe_load_all(result.output)]
    assert kinds == [
        ("NetworkPolicy", "bert-large-pretrain"),
        ("Service", "bert-large-pretrain"),
        ("PodGroup", "bert-large-pretrain-compile"),
        ("Pod", "bert-large-pretrain-compile-0-0"),
        ("Pod", "bert-large-pretrain-compile-0-1"),
        ("PodGroup", "bert-large-pretrain-train"),
        ("Pod", "bert-large-pretrain-train-0-0"),
        ("Pod", "bert-large-pretrain-train-0-1"),
    ]
    headers = [header for header, _, _ in _headed_documents(result.output)]
    assert all(h.startswith("# stage 1/2: compile (") for h in headers[:5])
    assert all(h.startswith("# stage 2/2: train (") for h in headers[5:])
    train = list(yaml.safe_load_all(result.output))[6]["spec"]["containers"][0]["command"]
    assert train[0] == "torchrun"
    assert "--steps_this_run" not in train


def test_render_stage_selects_one_stage() -> None:
    result = CliRunner().invoke(main, ["render", "-f", EXAMPLE, "--stage", "train"])
    assert result.exit_code == 0, result.output
    assert [(k, n) for _, k, n in _headed_documents(result.output)] == [
        ("PodGroup", "bert-large-pretrain-train"),
        ("Pod", "bert-large-pretrain-train-0-0"),
        ("Pod", "bert-large-pretrain-train-0-1"),
    ]


def test_render_without_a_compile_stage_says_so(tmp_path: Path) -> None:
    document = yaml.safe_load(Path(EXAMPLE).read_text())
    document["spec"]["compile"]["enabled"] = False
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(document))
    result = CliRunner().invoke(main, ["render", "-f", str(job)])
    assert result.exit_code == 0, result.output
    documents = _headed_documents(result.output)
    assert [k for _, k, _ in documents] == ["NetworkPolicy", "Service", "PodGroup", "Pod", "Pod"]
    assert documents[0][0].startswith("# stage 1/1: train (")
    refused = CliRunner().invoke(main, ["render", "-f", str(job), "--stage", "compile"])
    assert refused.exit_code != 0
    assert "has no compile stage (spec.compile.enabled is false)" in refused.output


def test_render_refuses_an_invalid_job_naming_each_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "trainium.dev/v1alpha1",
                "kind": "TrainingJob",
                "metadata": {"name": "x"},
                "spec": {"image": "i", "command": {"script": "s"}, "nodes": -1, "precison": "bf16"},
            }
        )
    )
    result = CliRunner().invoke(main, ["render", "-f", str(bad)])
    assert result.exit_code != 0
    assert "spec.nodes: Input should be greater than or equal to 1" in result.output
    assert "spec.precison: Extra inputs are not permitted" in result.output

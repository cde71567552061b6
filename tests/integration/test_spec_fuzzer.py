"""Spec fuzzer: invalid and edge-case TrainingJobs, derived from the CRD schema the pydantic model
generates, sent to the real API server with the operator running.

Every example is one mutation of a valid (suspended, so cheap) job: a leaf of the schema given a
value of the wrong type, out of range, off its enum or pattern, far too large, or an unknown field,
plus the cross-field rules (etcd without an endpoint, an inverted profile window, too many
processes, reserved env names). Each must be refused by the API server naming the field, or be
accepted and then either run (valid) or end Failed/InvalidSpec naming the field. The operator must
not crash, log a traceback, or keep reconciling once things settle, and a valid job running beside
the fuzzing keeps running untouched. Seeded (hypothesis `derandomize`), so every run sends the
same examples. The counts are printed.
"""

from __future__ import annotations

import copy
import json
import socket
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from integration.operator_harness import (
    OperatorProcess,
    create_job,
    get_job,
    job_manifest,
    job_pods,
    publish_report,
    running_operator,
    wait_gang_running,
    wait_phase,
)
from trainium_operator.api.crd import spec_schema
from trainium_operator.api.spec import TrainingJobSpec
from trainium_operator.devcluster.sim import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("crds")]

EXAMPLES = 1000
GROUP, VERSION, PLURAL = "trainium.dev", "v1alpha1", "trainingjobs"
# Fields the fuzzer leaves alone: the base job must stay suspended (no pods), and metadata-like
# pass-through maps accept any string by design.
SKIPPED = {"spec.runPolicy.suspend"}


@dataclass(frozen=True)
class Leaf:
    path: tuple[str, ...]  # ("runPolicy", "backoffLimit")
    schema: dict[str, Any]

    @property
    def dotted(self) -> str:
        return ".".join(("spec", *self.path))


def leaves(schema: dict[str, Any], path: tuple[str, ...] = ()) -> Iterator[Leaf]:
    if schema.get("type") == "object" and "properties" in schema:
        for name, child in schema["properties"].items():
            yield from leaves(child, (*path, name))
    elif path:
        yield Leaf(path, schema)


LEAVES = [leaf for leaf in leaves(spec_schema()) if leaf.dotted not in SKIPPED]
OBJECTS = sorted({leaf.path[:-1] for leaf in LEAVES if len(leaf.path) > 1} | {()}, key=len)


@dataclass(frozen=True)
class Mutation:
    kind: str  # how the value is wrong (or edgy)
    path: tuple[str, ...]
    value: Any
    field: str  # the field an error must name

    def apply(self, spec: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(spec)
        target = out
        for part in self.path[:-1]:
            target = target.setdefault(part, {})
        target[self.path[-1]] = self.value
        return out


def wrong_type(leaf: Leaf) -> st.SearchStrategy[Any]:
    kind = leaf.schema.get("type")
    others: dict[str, st.SearchStrategy[Any]] = {
        "string": st.one_of(st.integers(), st.booleans(), st.lists(st.integers(), max_size=2)),
        "integer": st.one_of(st.text(max_size=5), st.floats(0.5, 9.5), st.booleans()),
        "boolean": st.one_of(st.integers(2, 9), st.text(min_size=1, max_size=4)),
        "array": st.one_of(st.text(max_size=4), st.integers()),
        "object": st.one_of(st.text(max_size=4), st.integers(), st.lists(st.text(), max_size=2)),
    }
    return others.get(str(kind), st.integers())


def out_of_range(leaf: Leaf) -> st.SearchStrategy[Any] | None:
    schema = leaf.schema
    if schema.get("type") == "integer":
        options = []
        if "minimum" in schema:
            options.append(st.integers(schema["minimum"] - 10**6, schema["minimum"] - 1))
        if "maximum" in schema:
            options.append(st.integers(schema["maximum"] + 1, schema["maximum"] + 10**6))
        options.append(st.just(2**63))  # past int64
        return st.one_of(*options)
    if "enum" in schema:
        return st.text(min_size=1, max_size=12).filter(lambda v: v not in schema["enum"])
    if "pattern" in schema:
        return st.sampled_from(["has space", "semi;colon", "", "x" * 300, "ünïcödé"])
    if schema.get("minLength"):
        return st.just("")
    return None


def edge_valid(leaf: Leaf) -> st.SearchStrategy[Any] | None:
    schema = leaf.schema
    if schema.get("type") == "integer":
        bounds = [schema[k] for k in ("minimum", "maximum") if k in schema]
        return st.sampled_from(bounds) if bounds else None
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    return None


@st.composite
def mutations(draw: st.DrawFn) -> Mutation:
    leaf = draw(st.sampled_from(LEAVES))
    choices = ["wrong-type", "unknown-field", "cross-field"]
    if out_of_range(leaf) is not None:
        choices += ["out-of-range"] * 3
    if edge_valid(leaf) is not None:
        choices.append("edge-valid")
    kind = draw(st.sampled_from(choices))
    if kind == "wrong-type":
        return Mutation(kind, leaf.path, draw(wrong_type(leaf)), leaf.dotted)
    if kind == "out-of-range":
        strategy = out_of_range(leaf)
        assert strategy is not None
        return Mutation(kind, leaf.path, draw(strategy), leaf.dotted)
    if kind == "edge-valid":
        strategy = edge_valid(leaf)
        assert strategy is not None
        return Mutation(kind, leaf.path, draw(strategy), leaf.dotted)
    if kind == "unknown-field":
        parent = draw(st.sampled_from(OBJECTS))
        name = draw(st.sampled_from(["typo", "nodez", "backofLimit", "x-extra", "Nodes"]))
        return Mutation(kind, (*parent, name), draw(st.integers(0, 3)), name)
    return draw(
        st.sampled_from(
            [
                Mutation(kind, ("rendezvous",), {"backend": "etcd"}, "spec.rendezvous.endpoint"),
                Mutation(kind, ("profile",), {"startStep": 9, "endStep": 2}, "endStep"),
                Mutation(kind, ("processesPerNode",), 64, "spec.processesPerNode"),
                Mutation(kind, ("env",), [{"name": "RANK", "value": "0"}], "reserved"),
                Mutation(kind, ("env",), [{"name": "PET_X", "value": "0"}], "reserved"),
                Mutation(kind, ("env",), [{"name": ""}], "spec.env"),
                Mutation(kind, ("resources",), {"limits": {"memory": "lots"}}, "spec.resources"),
            ]
        )
    )


def base_spec() -> dict[str, Any]:
    spec = job_manifest("base", compile={"enabled": False})["spec"]
    spec["runPolicy"] = {**spec["runPolicy"], "suspend": True}
    return spec


def model_problems(spec: dict[str, Any]) -> str | None:
    try:
        TrainingJobSpec.model_validate(spec)
    except ValidationError as error:
        return str(error)
    return None


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    raise AssertionError(f"no {name} on /metrics")


def test_a_thousand_bad_specs_are_refused_or_failed_naming_the_field(
    dev_cluster: Any, namespace: str, tmp_path: Path
) -> None:
    clients = dev_cluster.clients
    port = free_port()
    with running_operator(
        dev_cluster, namespace, tmp_path, extra_args=("--metrics-port", str(port))
    ) as operator:
        # A valid neighbour, running throughout.
        create_job(clients, namespace, job_manifest("neighbour", compile={"enabled": False}))
        neighbour = wait_gang_running(clients, namespace, "neighbour", "train", 0)
        fuzz(clients, namespace, operator, port)
        job = get_job(clients, namespace, "neighbour")
        assert job["status"]["phase"] == "Training"
        assert job["status"]["restarts"]["total"] == 0
        assert {p.metadata.uid for p in job_pods(clients, namespace, "neighbour")} == {
            p.metadata.uid for p in neighbour
        }
        operator.assert_alive()
        assert "Traceback" not in operator.log()
        wait_phase(clients, namespace, "neighbour", "Training")


def fuzz(clients: Any, namespace: str, operator: OperatorProcess, port: int) -> None:
    outcomes: Counter[str] = Counter()
    accepted: dict[str, tuple[Mutation, str | None]] = {}
    problems: list[str] = []
    sent = 0

    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(mutation=mutations())
    def send(mutation: Mutation) -> None:
        nonlocal sent
        sent += 1
        name = f"fz-{sent}"
        spec = mutation.apply(base_spec())
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "TrainingJob",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
        try:
            # kubectl's default: unknown fields are an error, not silently dropped.
            clients.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, body, field_validation="Strict"
            )
        except Exception as error:
            status = getattr(error, "status", None)
            message = json.loads(getattr(error, "body", "{}") or "{}").get("message", str(error))
            outcomes[f"refused {status} ({mutation.kind})"] += 1
            if status not in (400, 422) or mutation.field not in message:
                problems.append(f"{mutation}: {status} {message[:300]}")
            return
        outcomes[f"accepted ({mutation.kind})"] += 1
        accepted[name] = (mutation, model_problems(spec))

    send()
    assert sent >= EXAMPLES

    def statuses() -> dict[str, dict[str, Any]]:
        listed = clients.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        return {j["metadata"]["name"]: j.get("status") or {} for j in listed["items"]}

    def settled(seen: dict[str, dict[str, Any]]) -> bool:
        return all(
            seen.get(name, {}).get("observedGeneration") == 1 and seen[name].get("phase")
            for name in accepted
        )

    final = wait_for(statuses, until=settled, timeout=300, description="accepted jobs seen")
    for name, (mutation, invalid) in accepted.items():
        status = final[name]
        if invalid is not None:
            outcomes["accepted -> Failed/InvalidSpec"] += 1
            if (status["phase"], status.get("reason")) != ("Failed", "InvalidSpec"):
                problems.append(f"{mutation}: expected InvalidSpec, got {status['phase']}")
            elif mutation.field.split(".")[-1] not in status["message"]:
                problems.append(f"{mutation}: InvalidSpec without the field: {status['message']}")
        else:
            outcomes["accepted -> valid"] += 1
            if status["phase"] == "Failed":
                problems.append(f"{mutation}: a valid spec failed: {status.get('message')}")
    # Never loops: once settled, reconciles stop (only the neighbour's pods may wake it).
    before = metric(port, "trainium_operator_reconciles_total")
    time.sleep(10)
    spun = metric(port, "trainium_operator_reconciles_total") - before
    errors = metric(port, "trainium_operator_reconcile_errors_total")
    report: list[str] = []
    report.append(f"spec fuzzer: {sent} examples")
    for outcome, count in sorted(outcomes.items()):
        report.append(f"  {outcome:<40} {count}")
    report.append(f"  reconciles in 10 s once settled          {spun:.0f}")
    report.append(f"  reconcile errors                         {errors:.0f}")
    report.append(f"  violations                               {len(problems)}")
    publish_report("spec-fuzzer", report)
    assert not problems, "\n".join(problems[:20])
    assert spun <= 5, f"{spun} reconciles in 10 s of quiet: the operator loops"
    assert errors == 0
    operator.assert_alive()

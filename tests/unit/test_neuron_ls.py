"""`neuron-ls` JSON in both documented shapes (`-j` up to Neuron 2.33, `--output-format json`
from 2.34), and the bounds that make a tenant pod's output safe to read."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from trainium_operator.api.instance_types import INSTANCE_TYPES
from trainium_operator.contract import neuron_ls
from trainium_operator.contract.neuron_ls import NeuronLsError

FIXTURES = Path(__file__).parent / "fixtures" / "neuron_ls"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def devices_of(name: str) -> list[dict[str, Any]]:
    data = json.loads(fixture(name))
    return data if isinstance(data, list) else data["neuron_devices"]


def test_the_json_output_of_a_trn2_gives_its_16_devices_64_cores_at_lnc_2() -> None:
    report = neuron_ls.parse(fixture("trn2-json-output.json"))
    trn2 = INSTANCE_TYPES["trn2.48xlarge"]
    assert report.shape == neuron_ls.JSON_OUTPUT
    assert report.device_count == trn2.neuron_devices
    assert report.core_count == trn2.logical_cores(2)
    assert report.lnc == 2
    first = report.devices[0]
    assert first.index == 0
    assert first.core_ids == (0, 1, 2, 3)
    assert first.connected_to == (12, 3, 4, 1)
    assert first.memory_bytes == 96 * 2**30
    assert (first.bdf, first.numa_node, first.cpu_affinity) == ("cc:00.0", 1, "48-95,144-191")
    assert first.processes == (
        neuron_ls.NeuronProcess(113985, "neuron-bench exec --run-as-cc-neff --...", "2.0.0"),
    )
    assert report.instance == {}


def test_the_json_output_of_a_trn1_has_no_lnc_and_32_cores() -> None:
    report = neuron_ls.parse(fixture("trn1-json-output.json"))
    assert report.device_count == 16
    assert report.core_count == INSTANCE_TYPES["trn1.32xlarge"].neuron_cores
    assert report.lnc is None
    assert all(d.processes == () for d in report.devices)


def test_the_2_34_output_format_gives_the_same_devices_and_the_instance_facts() -> None:
    new = neuron_ls.parse(fixture("trn2-output-format-json.json"))
    old = neuron_ls.parse(fixture("trn2-json-output.json"))
    assert new.shape == neuron_ls.OUTPUT_FORMAT_JSON
    assert new.devices == old.devices
    assert new.instance["instance_type"] == "trn2.48xlarge"
    assert new.instance["ultraserver.node_count"] == 4
    assert "neuron_devices" not in new.instance


def test_the_device_list_of_the_2_34_shape_is_found_by_its_entries_not_its_key() -> None:
    body = {
        "instance": {"type": "trn2.48xlarge"},
        "devices_v2": devices_of("trn2-json-output.json"),
    }
    report = neuron_ls.parse(json.dumps(body))
    assert report.device_count == 16
    assert report.instance == {"instance.type": "trn2.48xlarge"}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"instance_type": "trn2.48xlarge"}, "no top-level list of devices"),
        (
            {
                "a": [{"neuron_device": 0, "nc_count": 4}],
                "b": [{"neuron_device": 1, "nc_count": 4}],
            },
            r"2 \(a, b\) top-level list of devices",
        ),
        ("trn2", "neither a device list"),
    ],
)
def test_an_output_without_exactly_one_device_list_is_refused(body: Any, message: str) -> None:
    with pytest.raises(NeuronLsError, match=message):
        neuron_ls.parse(json.dumps(body))


def test_the_command_follows_the_sdk() -> None:
    assert neuron_ls.argv_for((2, 30)) == ("neuron-ls", "--json-output")
    assert neuron_ls.argv_for((2, 33)) == ("neuron-ls", "--json-output")
    assert neuron_ls.argv_for((2, 34)) == ("neuron-ls", "--output-format", "json")
    assert neuron_ls.argv_for((3, 0)) == ("neuron-ls", "--output-format", "json")


# ---- hostile output: a tenant's pod writes what it likes -----------------------------------


def test_output_above_the_size_cap_is_refused_unparsed() -> None:
    raw = b"[" + b" " * neuron_ls.MAX_BYTES + b"]"
    with pytest.raises(NeuronLsError, match="larger than"):
        neuron_ls.parse(raw)


def test_deep_nesting_is_refused_before_the_decoder_recurses() -> None:
    raw = "[" * 100_000 + "]" * 100_000
    started = time.monotonic()
    with pytest.raises(NeuronLsError, match="nested deeper than 8"):
        neuron_ls.parse(raw)
    assert time.monotonic() - started < 1.0


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    devices = devices_of("trn2-json-output.json")
    devices[0]["neuron_processes"][0]["command"] = "python -c '" + "[{" * 500 + "'"
    report = neuron_ls.parse(json.dumps(devices))
    assert len(report.devices[0].processes[0].command) == neuron_ls.MAX_STRING


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d[0].update(nc_count=10**9), r"devices\[0\]\.nc_count: an integer 0\.\.16"),
        (lambda d: d[1].update(nc_count=True), r"devices\[1\]\.nc_count"),
        (lambda d: d[2].pop("neuron_device"), r"devices\[2\]\.neuron_device"),
        (lambda d: d[3].update(neuron_device=0), "a neuron_device id appears twice"),
        (lambda d: d[4].update(neuroncore_ids=list(range(64))), r"devices\[4\]\.neuroncore_ids"),
        (lambda d: d[5].update(memory_size="lots"), r"devices\[5\]\.memory_size"),
        (
            lambda d: d[6].update(neuron_processes=[{"pid": 1}] * 257),
            r"devices\[6\]\.neuron_processes: more than 256",
        ),
        (
            lambda d: d[7].update(neuron_processes=[{"pid": -4}]),
            r"devices\[7\]\.neuron_processes\[0\]\.pid",
        ),
        (lambda d: d[8].update(logical_neuroncore_config=3), "logical_neuroncore_config"),
        (lambda d: d[9].update(bdf={"x": 1}), r"devices\[9\]\.bdf: a string"),
        (lambda d: d.extend([dict(d[0], neuron_device=i) for i in range(16, 70)]), "more than 64"),
    ],
)
def test_a_field_out_of_its_bounds_is_refused_naming_it(change: Any, message: str) -> None:
    devices = devices_of("trn2-json-output.json")
    change(devices)
    with pytest.raises(NeuronLsError, match=message):
        neuron_ls.parse(json.dumps(devices))


def test_numbers_written_as_decimal_strings_are_read_and_others_refused() -> None:
    devices = devices_of("trn1-json-output.json")
    devices[0]["nc_count"] = "2"
    assert neuron_ls.parse(json.dumps(devices)).devices[0].core_count == 2
    devices[0]["nc_count"] = "2.0"
    with pytest.raises(NeuronLsError, match="nc_count"):
        neuron_ls.parse(json.dumps(devices))


def test_instance_facts_are_bounded_in_number_key_and_value() -> None:
    body: dict[str, Any] = {f"k{i}": "v" * 1000 for i in range(500)}
    body["x" * 500] = 1
    body["nested"] = {"deep": {"deeper": 1}, "list": [1, 2], "n": 10**30}
    body["neuron_devices"] = devices_of("trn2-json-output.json")
    report = neuron_ls.parse(json.dumps(body))
    assert len(report.instance) == neuron_ls.MAX_INSTANCE_FACTS
    assert all(len(k) <= neuron_ls.MAX_FACT_KEY for k in report.instance)
    assert all(len(str(v)) <= neuron_ls.MAX_STRING for v in report.instance.values())


@pytest.mark.parametrize("raw", [b"\xff\xfe[]", b"{not json", b'{"a": NaN'])
def test_unreadable_bytes_are_a_neuron_ls_error(raw: bytes) -> None:
    with pytest.raises(NeuronLsError):
        neuron_ls.parse(raw)

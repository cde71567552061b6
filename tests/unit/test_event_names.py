"""Events are named and timed so that they sort in the order they happened: names by nanoseconds
(the API server lists by name), eventTime by microseconds (what kubectl sorts by)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from trainium_operator.k8s.client import event_micro_time, event_name

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def test_event_names_sort_in_the_order_the_events_were_posted() -> None:
    job = {"metadata": {"name": "bert-large"}}
    names = [event_name(job) for _ in range(50)]
    assert sorted(names) == names
    assert len(set(names)) == len(names)


def test_an_event_name_is_a_valid_object_name_that_starts_with_the_jobs_name() -> None:
    name = event_name({"metadata": {"name": "bert-large"}})
    assert name.startswith("bert-large.")
    assert DNS_SUBDOMAIN.match(name)
    assert len(name) <= 253


def test_an_event_time_keeps_microseconds_so_events_of_one_second_sort_in_order() -> None:
    first = datetime(2026, 12, 2, 22, 26, 6, 100, tzinfo=UTC)
    second = first + timedelta(microseconds=1)
    assert event_micro_time(first) == "2026-12-02T22:26:06.000100Z"
    assert event_micro_time(first) < event_micro_time(second)

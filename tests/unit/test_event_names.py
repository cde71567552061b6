"""Event names order events as they happened: kubectl describe leaves same-second ties in the
API server's order, which is by name."""

from __future__ import annotations

import re

from trainium_operator.k8s.client import event_name

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

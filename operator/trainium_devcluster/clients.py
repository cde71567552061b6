"""Kubernetes API clients for one kubeconfig, grouped so helpers and tests pass a single object."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config

from trainium_devcluster import sim


@dataclass(frozen=True)
class Clients:
    api_client: Any
    core: Any  # CoreV1Api
    custom: Any  # CustomObjectsApi
    apiextensions: Any  # ApiextensionsV1Api
    storage: Any  # StorageV1Api
    coordination: Any  # CoordinationV1Api
    apps: Any  # AppsV1Api
    batch: Any  # BatchV1Api
    scheduling: Any  # SchedulingV1Api (PriorityClasses)


def clients_for(kubeconfig: Path) -> Clients:
    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    return Clients(
        api_client=api_client,
        core=client.CoreV1Api(api_client),
        custom=client.CustomObjectsApi(api_client),
        apiextensions=client.ApiextensionsV1Api(api_client),
        storage=client.StorageV1Api(api_client),
        coordination=client.CoordinationV1Api(api_client),
        apps=client.AppsV1Api(api_client),
        batch=client.BatchV1Api(api_client),
        scheduling=client.SchedulingV1Api(api_client),
    )


def is_status(error: BaseException, *codes: int) -> bool:
    """True for an API error with one of these HTTP status codes."""
    return isinstance(error, client.ApiException) and error.status in codes


def create_if_missing(create: Callable[[], Any]) -> bool:
    """Runs a create call; an object already there (409) is fine. True if it created one."""
    try:
        create()
    except Exception as error:
        if is_status(error, 409):
            return False
        raise
    return True


def apply_crds(clients: Clients, crds: list[dict[str, Any]], *, timeout: float = 30) -> None:
    """Applies every CRD, then waits until each is Established (served)."""
    for crd in crds:
        apply_crd(clients, crd)
    for crd in crds:
        wait_established(clients, crd["metadata"]["name"], timeout=timeout)


def wait_established(clients: Clients, name: str, *, timeout: float = 30) -> None:
    """Waits until the CRD is Established (served). Not `kubectl wait --for=condition`: kubectl
    v1.36 fails at once on a CRD whose status has no conditions yet, as right after its apply."""
    sim.wait_for(
        functools.partial(clients.apiextensions.read_custom_resource_definition, name),
        until=lambda found: any(
            c.type == "Established" and c.status == "True"
            for c in ((found.status.conditions if found.status else None) or [])
        ),
        timeout=timeout,
        description=f"CRD {name} established",
    )


def apply_crd(clients: Clients, crd: dict[str, Any]) -> None:
    """Creates the CRD, or replaces the one there with it (a new version of its manifest)."""
    name = crd["metadata"]["name"]
    try:
        existing = clients.apiextensions.read_custom_resource_definition(name)
    except Exception as error:
        if not is_status(error, 404):
            raise
        clients.apiextensions.create_custom_resource_definition(crd)
        return
    body = {
        **crd,
        "metadata": {**crd["metadata"], "resourceVersion": existing.metadata.resource_version},
    }
    clients.apiextensions.replace_custom_resource_definition(name, body)

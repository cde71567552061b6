"""Kubernetes API clients for one kubeconfig, grouped so helpers and tests pass a single object."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client, config


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

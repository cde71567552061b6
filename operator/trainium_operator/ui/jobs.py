"""The profile UI's list of TrainingJobs, read from the cluster (read-only).

Every job is listed, not only those with profiling on: the list is where a user watches a
job's live progress and health, and a job without a profile is as much worth watching; its
row says profiling is off instead of offering a profile to load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from trainium_operator.k8s.client import Cluster, load_api_client
from trainium_operator.ui.live import job_live
from trainium_operator.ui.profiles import JobInfo, JobLister


def job_info(item: dict[str, Any]) -> JobInfo:
    """One TrainingJob object as the UI lists it."""
    status = item.get("status") or {}
    profile = status.get("profile") or {}
    on_demand = status.get("onDemandProfile") or {}
    return JobInfo(
        name=item["metadata"]["name"],
        namespace=item["metadata"]["namespace"],
        created=item["metadata"].get("creationTimestamp", ""),
        status=status.get("phase") or "Pending",
        profile_path=profile.get("path"),
        profile_s3_uri=profile.get("s3Uri"),
        on_demand_path=on_demand.get("path") if on_demand.get("state") == "Captured" else None,
        profiling=bool(((item.get("spec") or {}).get("profile") or {}).get("enabled")),
        live=job_live(status),
    )


def listed_jobs(items: list[dict[str, Any]]) -> list[JobInfo]:
    """Every TrainingJob, newest first."""
    return sorted((job_info(item) for item in items), key=lambda job: job.created, reverse=True)


def cluster_job_lister(kubeconfig: str | None = None, namespaces: Sequence[str] = ()) -> JobLister:
    """Lists cluster-wide, or only `namespaces` (what a per-namespace Role allows)."""
    cluster = Cluster(load_api_client(kubeconfig))

    def list_items() -> list[dict[str, Any]]:
        if not namespaces:
            return cluster.list_training_jobs()
        return [item for ns in namespaces for item in cluster.list_training_jobs(ns)]

    async def list_jobs() -> list[JobInfo]:
        return listed_jobs(await asyncio.to_thread(list_items))

    return list_jobs

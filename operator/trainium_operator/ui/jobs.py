"""The profile UI's list of TrainingJobs with profiling on, read from the cluster (read-only)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from trainium_operator.k8s.client import Cluster, load_api_client
from trainium_operator.ui.profiles import JobInfo, JobLister


def profiled_jobs(items: list[dict[str, Any]]) -> list[JobInfo]:
    """TrainingJobs whose spec turns profiling on, newest first."""
    jobs = [
        JobInfo(
            name=item["metadata"]["name"],
            namespace=item["metadata"]["namespace"],
            created=item["metadata"].get("creationTimestamp", ""),
            status=(item.get("status") or {}).get("phase") or "Pending",
            profile_path=((item.get("status") or {}).get("profile") or {}).get("path"),
            profile_s3_uri=((item.get("status") or {}).get("profile") or {}).get("s3Uri"),
        )
        for item in items
        if ((item.get("spec") or {}).get("profile") or {}).get("enabled")
    ]
    return sorted(jobs, key=lambda job: job.created, reverse=True)


def cluster_job_lister(kubeconfig: str | None = None, namespaces: Sequence[str] = ()) -> JobLister:
    """Lists cluster-wide, or only `namespaces` (what a per-namespace Role allows)."""
    cluster = Cluster(load_api_client(kubeconfig))

    def list_items() -> list[dict[str, Any]]:
        if not namespaces:
            return cluster.list_training_jobs()
        return [item for ns in namespaces for item in cluster.list_training_jobs(ns)]

    async def list_jobs() -> list[JobInfo]:
        return profiled_jobs(await asyncio.to_thread(list_items))

    return list_jobs

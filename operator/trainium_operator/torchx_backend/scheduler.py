"""The TorchX `trainium` scheduler: `torchx run -s trainium ...` submits a TrainingJob.

Registered through torchx's `torchx.schedulers` entry points (pyproject.toml, next to
torchx's own built-ins registered again, so installing us hides none of them).

- `submit_dryrun` maps the AppDef (`appdef.app_to_training_job`) and renders the objects the
  operator will create for it, every stage, exactly as `trainium-operator render` prints them;
- `schedule` creates the TrainingJob; the app id is `<namespace>:<name>`;
- `describe` maps the job's phase and its current gang's pods to TorchX states;
- `log_iter` streams the log of node rank k's pod of the newest gang;
- `cancel` suspends the job (its pods stop, the job and its status stay for `torchx status`),
  `delete` deletes it; `list` lists the namespace's TrainingJobs.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import yaml
from torchx import specs
from torchx.schedulers.api import DescribeAppResponse, ListAppResponse, Scheduler, Stream

from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import TRAINING_CONTAINER
from trainium_operator.builders.job import LABEL_ATTEMPT, LABEL_JOB_NAME, LABEL_NODE_RANK, Stage
from trainium_operator.contract import workload_env
from trainium_operator.k8s.client import Cluster, load_api_client
from trainium_operator.lifecycle.render import render_stages
from trainium_operator.torchx_backend.appdef import (
    AppDefError,
    RunConfig,
    app_to_training_job,
    job_name,
)

BACKEND = "trainium"
ANNOTATION_ROLE = "trainium.dev/torchx-role"
ANNOTATION_CANCELLED = "trainium.dev/torchx-cancelled"

AppState = specs.AppState
PHASE_STATES = {
    "Pending": AppState.PENDING,
    "Compiling": AppState.RUNNING,
    "Training": AppState.RUNNING,
    "Restarting": AppState.RUNNING,
    "Suspended": AppState.PENDING,
    "Succeeded": AppState.SUCCEEDED,
    "Failed": AppState.FAILED,
}
POD_STATES = {
    "Pending": AppState.PENDING,
    "Running": AppState.RUNNING,
    "Succeeded": AppState.SUCCEEDED,
    "Failed": AppState.FAILED,
}


@dataclass
class TrainiumRequest:
    """What `schedule` submits, plus what the operator will create for it."""

    job: Obj
    stages: list[tuple[Stage, list[Obj]]]

    def __str__(self) -> str:
        parts = [
            "# TrainingJob (torchx -s trainium); the operator then creates the objects below\n"
            + yaml.safe_dump(self.job, sort_keys=False, width=100)
        ]
        for index, (stage, objects) in enumerate(self.stages, start=1):
            parts += [
                f"# stage {index}/{len(self.stages)}: {stage.value}\n"
                + yaml.safe_dump(obj, sort_keys=False, width=100)
                for obj in objects
            ]
        return "---\n".join(parts)


def _format(request: TrainiumRequest) -> str:
    return str(request)


def _random_suffix() -> str:
    return secrets.token_hex(3)


def parse_app_id(app_id: str) -> tuple[str, str]:
    namespace, sep, name = app_id.partition(":")
    if not sep or not namespace or not name:
        raise ValueError(f"app id {app_id!r} is not <namespace>:<name>")
    return namespace, name


def job_state(job: Obj) -> Any:
    """The TorchX AppState of a TrainingJob."""
    annotations = job.get("metadata", {}).get("annotations") or {}
    phase = (job.get("status") or {}).get("phase")
    if annotations.get(ANNOTATION_CANCELLED) == "true" and phase not in ("Succeeded", "Failed"):
        return AppState.CANCELLED
    if phase is None:
        return AppState.SUBMITTED
    return PHASE_STATES.get(phase, AppState.UNKNOWN)


class TrainiumScheduler(Scheduler):  # type: ignore[misc]  # torchx ships no type information
    def __init__(
        self,
        session_name: str,
        *,
        cluster: Cluster | None = None,
        name_suffix: Callable[[], str] = _random_suffix,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        super().__init__(BACKEND, session_name)
        self._cluster = cluster
        self._name_suffix = name_suffix
        self._now = now

    def _k8s(self) -> Cluster:
        if self._cluster is None:
            self._cluster = Cluster(load_api_client())
        return self._cluster

    # -- options -----------------------------------------------------------------------------
    def _run_opts(self) -> Any:
        opts = specs.runopts()
        opts.add("namespace", type_=str, default="default", help="namespace of the TrainingJob")
        opts.add("queue", type_=str, help="Volcano queue (spec.scheduling.queue)")
        opts.add(
            "priority_class", type_=str, help="PriorityClass (spec.scheduling.priorityClassName)"
        )
        opts.add("service_account", type_=str, help="ServiceAccount of the pods")
        opts.add(
            "instance_type",
            type_=str,
            help="Trainium instance type when the role's resource names none",
        )
        opts.add(
            "neuron_stack",
            type_=str,
            help="Neuron PyTorch stack (spec.neuron.stack): "
            + " or ".join(workload_env.NEURON_STACKS)
            + "; default: the instance type's (xla on trn1, native on trn2)",
        )
        opts.add(
            "lnc",
            type_=int,
            help="logical NeuronCore config on Trainium2 (spec.lnc): 1 or 2 (default 2)",
        )
        opts.add(
            "etcd_endpoint",
            type_=str,
            help="host:port of an etcd rendezvous server (default: c10d on rank 0)",
        )
        return opts

    @staticmethod
    def _config(cfg: Mapping[str, Any] | None) -> RunConfig:
        cfg = cfg or {}
        return RunConfig(
            namespace=str(cfg.get("namespace") or "default"),
            queue=cfg.get("queue"),
            priority_class=cfg.get("priority_class"),
            service_account=cfg.get("service_account"),
            instance_type=cfg.get("instance_type"),
            etcd_endpoint=cfg.get("etcd_endpoint"),
            neuron_stack=cfg.get("neuron_stack"),
            lnc=cfg.get("lnc"),
        )

    # -- submit ------------------------------------------------------------------------------
    def _submit_dryrun(self, app: Any, cfg: Mapping[str, Any] | None = None) -> Any:
        config = self._config(cfg)
        job = app_to_training_job(app, config, name=job_name(app.name, self._name_suffix()))
        job["metadata"]["annotations"][ANNOTATION_ROLE] = app.roles[0].name
        try:
            stages = render_stages(job, self._now())
        except ValueError as error:
            raise AppDefError(f"the TrainingJob for app {app.name!r} is invalid: {error}") from None
        return specs.AppDryRunInfo(TrainiumRequest(job, stages), _format)

    def _validate(self, app: Any, scheduler: str, cfg: Any = None) -> None:
        # Resources are the instance type's whole node; app_to_training_job checks the rest.
        pass

    def schedule(self, dryrun_info: Any) -> str:
        request: TrainiumRequest = dryrun_info.request
        namespace = request.job["metadata"]["namespace"]
        created = self._k8s().create_training_job(namespace, request.job)
        return f"{namespace}:{created['metadata']['name']}"

    # -- observe -----------------------------------------------------------------------------
    def _current_pods(self, namespace: str, name: str) -> list[Obj]:
        """The newest gang's pods (highest attempt; training over compile at the same one)."""
        pods = self._k8s().list_pods(namespace, f"{LABEL_JOB_NAME}={name}")

        def order(pod: Obj) -> tuple[int, int]:
            labels = pod["metadata"].get("labels") or {}
            stage = labels.get("trainium.dev/stage")
            return int(labels.get(LABEL_ATTEMPT, 0)), 1 if stage == Stage.TRAIN.value else 0

        if not pods:
            return []
        newest = max(order(p) for p in pods)
        return [p for p in pods if order(p) == newest]

    def describe(self, app_id: str) -> DescribeAppResponse | None:
        namespace, name = parse_app_id(app_id)
        job = self._k8s().get_training_job(namespace, name)
        if job is None:
            return None
        status = job.get("status") or {}
        role_name = (job["metadata"].get("annotations") or {}).get(ANNOTATION_ROLE, name)
        spec = job.get("spec") or {}
        replicas = []
        for pod in sorted(
            self._current_pods(namespace, name),
            key=lambda p: int(p["metadata"]["labels"].get(LABEL_NODE_RANK, 0)),
        ):
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            replicas.append(
                specs.ReplicaStatus(
                    id=int(pod["metadata"]["labels"].get(LABEL_NODE_RANK, 0)),
                    state=POD_STATES.get(phase, AppState.UNKNOWN),
                    role=role_name,
                    hostname=pod["metadata"]["name"],
                )
            )
        return DescribeAppResponse(
            app_id=app_id,
            state=job_state(job),
            num_restarts=int((status.get("restarts") or {}).get("total", 0)),
            msg=status.get("message") or status.get("phase") or "submitted",
            roles_statuses=[specs.RoleStatus(role_name, replicas)],
            roles=[
                specs.Role(
                    name=role_name,
                    image=spec.get("image", ""),
                    num_replicas=int(spec.get("nodes", 1)),
                )
            ],
        )

    def list(self, cfg: Mapping[str, Any] | None = None) -> list[ListAppResponse]:
        namespace = self._config(cfg).namespace if cfg else None
        return [
            ListAppResponse(
                app_id=f"{job['metadata']['namespace']}:{job['metadata']['name']}",
                state=job_state(job),
                name=job["metadata"]["name"],
            )
            for job in self._k8s().list_training_jobs(namespace)
        ]

    def log_iter(  # noqa: PLR0917 - torchx's signature
        self,
        app_id: str,
        role_name: str,
        k: int = 0,
        regex: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        should_tail: bool = False,
        streams: Stream | None = None,
    ) -> Iterable[str]:
        namespace, name = parse_app_id(app_id)
        if streams not in (None, Stream.COMBINED):
            raise ValueError("pod logs combine stdout and stderr: use --streams combined")
        pods = [
            p
            for p in self._current_pods(namespace, name)
            if p["metadata"]["labels"].get(LABEL_NODE_RANK) == str(k)
        ]
        if not pods:
            raise ValueError(f"{app_id} has no pod for node rank {k} (role {role_name!r})")
        lines: Iterator[str] = self._k8s().pod_log_lines(
            namespace, pods[0]["metadata"]["name"], TRAINING_CONTAINER, follow=should_tail
        )
        if regex:
            pattern = re.compile(regex)
            return (line for line in lines if pattern.search(line))
        return lines

    # -- stop --------------------------------------------------------------------------------
    def _cancel_existing(self, app_id: str) -> None:
        namespace, name = parse_app_id(app_id)
        self._k8s().patch_training_job(
            namespace,
            name,
            {
                "metadata": {"annotations": {ANNOTATION_CANCELLED: "true"}},
                "spec": {"runPolicy": {"suspend": True}},
            },
        )

    def _delete_existing(self, app_id: str) -> None:
        namespace, name = parse_app_id(app_id)
        self._k8s().delete_training_job(namespace, name)


def create_scheduler(session_name: str, **kwargs: Any) -> TrainiumScheduler:
    """torchx's scheduler factory; unknown keyword arguments are ignored."""
    return TrainiumScheduler(session_name)

"""The job as builders see it: identity, parsed spec, and every derived name and path.

Names are deterministic from job name, stage, attempt and rank, so a repeated reconcile
finds what exists instead of creating twins (`api.object_names`, the shared names).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from trainium_operator.api import kueue, topology
from trainium_operator.api import spec as spec_model
from trainium_operator.api.instance_types import INSTANCE_TYPES
from trainium_operator.api.spec import TrainingJobSpec
from trainium_operator.api.topology import Placement, TopologyLevel, TopologyMode
from trainium_operator.contract import neff_cache, workload_env

APP_NAME = "trainium-operator"
LABEL_JOB_NAME = "trainium.dev/job-name"
LABEL_STAGE = "trainium.dev/stage"
LABEL_NODE_RANK = "trainium.dev/node-rank"
LABEL_ATTEMPT = "trainium.dev/attempt"
# Volcano reads this annotation to put a pod in its PodGroup.
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
# The API group and version of Volcano's PodGroups and Queues.
VOLCANO_GROUP = "scheduling.volcano.sh"
VOLCANO_VERSION = "v1beta1"
VOLCANO_SCHEDULER = "volcano"
DEFAULT_DATA_SUBDIR = "bert_pretrain_wikicorpus_tokenized_hdf5_seqlen128"


class Stage(enum.StrEnum):
    COMPILE = "compile"
    TRAIN = "train"


@dataclass(frozen=True, slots=True)
class JobRef:
    """A TrainingJob's identity plus its validated spec."""

    name: str
    namespace: str
    uid: str
    generation: int
    spec: TrainingJobSpec
    # The operator's health-channel endpoint (`run --health-url`); None: the operator serves
    # none, so no pod gets the channel's env or token.
    health_url: str | None = None
    # spec.podTemplate fields the allowlist refuses that a job admitted before it carries: its
    # pods are built without them (lifecycle/parse.py), and the operator warns naming them.
    dropped_pod_fields: tuple[str, ...] = ()
    # The LocalQueue of the job's `kueue.x-k8s.io/queue-name` label: Kueue queues its gangs
    # (builders/kueue.py); None: Volcano does, in spec.scheduling.queue.
    kueue_queue: str | None = None
    # The WorkloadPriorityClass of its `kueue.x-k8s.io/priority-class` label.
    kueue_priority_class: str | None = None

    @property
    def queued_by_kueue(self) -> bool:
        return self.kueue_queue is not None

    @property
    def scheduler_name(self) -> str:
        """The scheduler of the job's pods: spec.scheduling.schedulerName, else Volcano for a
        job Volcano queues and the kube-scheduler for one Kueue admits."""
        given = self.spec.scheduling.scheduler_name
        if given:
            return given
        return kueue.KUBE_SCHEDULER if self.queued_by_kueue else VOLCANO_SCHEDULER

    def placement(self, topology_for: frozenset[str] = frozenset()) -> Placement | None:
        """Where the gang must or should sit in the network: spec.scheduling.topology, else, for
        a gang that fits in one UltraServer, Preferred within one, but only where the operator
        keeps topology for the job's scheduler (`topology_for`, `run --topology`): a Kueue pod
        set asking for topology is admitted only to a flavor that has one (Kueue's
        checkPodSetAndFlavorMatchForTAS, v0.19.2). Preferred, never Required: a gang that
        waits for one free UltraServer could wait forever."""
        asked = self.spec.scheduling.topology
        if asked is not None:
            return Placement(asked.level, asked.mode)
        scheduler = topology.KUEUE if self.queued_by_kueue else topology.VOLCANO
        fits = INSTANCE_TYPES[self.spec.instance_type.value].ultraserver_nodes
        if scheduler in topology_for and self.spec.nodes <= fits:
            return Placement(TopologyLevel.ULTRASERVER, TopologyMode.PREFERRED)
        return None

    @property
    def health_channel(self) -> bool:
        """Whether training pods report progress to the operator (contract/channel)."""
        return self.health_url is not None and self.spec.health.enabled

    # -- names -------------------------------------------------------------------------
    @property
    def service_name(self) -> str:
        return self.name

    @property
    def network_policy_name(self) -> str:
        return self.name

    def podgroup_name(self, stage: Stage) -> str:
        return f"{self.name}-{stage.value}"

    def kueue_group_name(self, stage: Stage, attempt: int) -> str:
        """The Kueue pod group (and Workload) of one stage's gang of one attempt."""
        return kueue.group_name(self.name, stage.value, attempt)

    def pod_name(self, stage: Stage, attempt: int, rank: int) -> str:
        if stage is Stage.COMPILE:
            return f"{self.name}-compile-{attempt}-{rank}"
        return f"{self.name}-train-{attempt}-{rank}"

    @staticmethod
    def pod_hostname(stage: Stage, rank: int) -> str:
        # Stable across attempts so the rank-0 rendezvous address never changes.
        return f"{stage.value}-{rank}"

    # -- paths on the shared volume ----------------------------------------------------
    @property
    def mount_path(self) -> str:
        return self.spec.storage.mount_path.rstrip("/") or "/"

    def _under_mount(self, *parts: str) -> str:
        return "/".join([self.mount_path.rstrip("/"), *parts])

    @property
    def data_dir(self) -> str:
        return self.spec.data_dir or self._under_mount(DEFAULT_DATA_SUBDIR)

    @property
    def output_root(self) -> str:
        """Read-only to a gang: the attempts' own directories are under it."""
        return self.spec.output_dir or self._under_mount("output", self.namespace, self.name)

    def output_dir(self, stage: Stage, attempt: int) -> str:
        """Where gang `attempt` of `stage` writes: its own directory, so a gang of an earlier
        attempt that still runs (a partitioned node) cannot touch what a later one reads."""
        return workload_env.attempt_output_dir(self.output_root, stage.value, attempt)

    @property
    def cache_root(self) -> str:
        return self.spec.compile.cache_dir or self._under_mount("neuron_cache")

    @property
    def cache_set(self) -> str:
        return self.spec.compile.cache_set or self.name

    def neuron_cache_dir(self, rank: int) -> str:
        # One cache per node rank: the Neuron cache breaks with concurrent writers on
        # Lustre/NFS, and compile pod r warms exactly what training pod r reads.
        return f"{self.cache_root.rstrip('/')}/{self.cache_set}_{rank}"

    @property
    def compiler_key(self) -> str:
        """What keys the native NEFF cache by compiler: spec.neuron.compilerVersion, else the
        image (contract/neff_cache.image_cache_key)."""
        return self.spec.neuron.compiler_version or neff_cache.image_cache_key(self.spec.image)

    def native_cache_dir(self, rank: int) -> str:
        """The native stack's cache of node rank `rank` (contract/neff_cache.native_cache_dir)."""
        lnc = self.spec.effective_lnc or 1  # the native stack runs only where LNC exists
        return neff_cache.native_cache_dir(
            self.cache_root, self.cache_set, rank, self.compiler_key, lnc
        )

    def transformers_cache_dir(self, rank: int) -> str:
        return self._under_mount("transformers_cache", f"{self.cache_set}_{rank}")

    def profile_dir(self, attempt: int) -> str:
        root = self.spec.profile.output_dir or self._under_mount("profiles")
        return f"{root.rstrip('/')}/{self.namespace}/{self.name}/{attempt}"

    def rendezvous_id(self, stage: Stage, attempt: int) -> str:
        # Unique per gang so a restarted gang never joins a stale rendezvous.
        return f"{self.uid[:8]}-{stage.value}-{attempt}"

    # -- metadata ----------------------------------------------------------------------
    def labels(self, stage: Stage | None = None) -> dict[str, str]:
        labels = {
            "app.kubernetes.io/name": APP_NAME,
            "app.kubernetes.io/managed-by": APP_NAME,
            "app.kubernetes.io/instance": self.name,
            LABEL_JOB_NAME: self.name,
        }
        if stage is not None:
            labels["app.kubernetes.io/component"] = stage.value
            labels[LABEL_STAGE] = stage.value
        return labels

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": spec_model.API_VERSION,
            "kind": spec_model.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def metadata(self, name: str, stage: Stage | None = None) -> dict[str, Any]:
        return {
            "name": name,
            "namespace": self.namespace,
            "labels": self.labels(stage),
            "ownerReferences": [self.owner_reference()],
        }

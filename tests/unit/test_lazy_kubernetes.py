"""The Kubernetes client's packages loaded lazily (k8s.lazy_kubernetes): the same objects under
the same names, loaded when used; an __init__ it cannot read is imported as usual."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainium_operator.k8s import lazy_kubernetes

# In a fresh interpreter: resolve every name the lazy packages expose, then run each package's
# real __init__ into a plain dict (its imports now hit loaded modules) and compare the two.
SAME_OBJECTS = """
import __future__, json, sys
from pathlib import Path
from trainium_operator.k8s import lazy_kubernetes
lazy_kubernetes.install()
import kubernetes, kubernetes.client, kubernetes.client.api, kubernetes.client.models
result = {}
for name in sorted(lazy_kubernetes.LAZY_PACKAGES):
    package = sys.modules[name]
    lazy = {key: getattr(package, key) for key in package._lazy_table}
    eager = {"__name__": name, "__package__": name, "__path__": package.__path__}
    exec(compile(Path(package.__file__).read_text(), package.__file__, "exec"), eager)
    public = {
        k: v
        for k, v in eager.items()
        if (not k.startswith("__") or k == "__version__")
        and not isinstance(v, __future__._Feature)  # from __future__ import ...: no name to keep
    }
    result[name] = {
        "type": type(package).__name__,
        "names": len(public),
        "missing": sorted(set(public) - set(lazy) - {"__version__"}),
        "different": sorted(k for k in lazy if public.get(k) is not lazy[k]),
        "version": getattr(package, "__version__", None) == public.get("__version__"),
    }
print(json.dumps(result))
"""

OPERATOR_START = """
import json, sys
import trainium_operator.controller.wiring, trainium_operator.controller.handlers
loaded = [m for m in sys.modules if m.startswith("kubernetes")]
print(json.dumps({"modules": len(loaded), "models": sum(".models." in m for m in loaded)}))
"""


def run_python(code: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    answer: dict[str, object] = json.loads(result.stdout)
    return answer


def test_every_name_of_the_clients_packages_is_the_object_its_init_would_bind() -> None:
    result = run_python(SAME_OBJECTS)
    assert set(result) == set(lazy_kubernetes.LAZY_PACKAGES)
    for package, seen in result.items():
        assert isinstance(seen, dict)
        assert seen["type"] == "LazyPackage", package  # read, not imported as usual
        assert seen["missing"] == [], package
        assert seen["different"] == [], package
        assert seen["version"], package
    models = result["kubernetes.client.models"]
    assert isinstance(models, dict)
    assert models["names"] > 500  # the whole model set, not an empty table


def test_the_operator_starts_without_the_clients_models_and_api_classes() -> None:
    loaded = run_python(OPERATOR_START)
    assert loaded["models"] == 2  # kopf's V1ObjectMeta and V1OwnerReference
    assert isinstance(loaded["modules"], int)
    assert loaded["modules"] < 40  # of about 870 imported by `import kubernetes`


def test_relative_and_absolute_imports_map_to_their_modules() -> None:
    source = (
        '"""doc"""\n'
        "from __future__ import absolute_import\n"
        '__version__ = "1.2"\n'
        "from . import client\n"
        "from .config import load as load_config\n"
        "from kubernetes.client.models.v1_pod import V1Pod\n"
    )
    read = lazy_kubernetes.import_table("kubernetes", source)
    assert read is not None
    table, constants = read
    assert table == {
        "client": ("kubernetes.client", None),
        "load_config": ("kubernetes.config", "load"),
        "V1Pod": ("kubernetes.client.models.v1_pod", "V1Pod"),
    }
    assert constants == {"__version__": "1.2"}
    nested = lazy_kubernetes.import_table(
        "kubernetes.client.api", "from ..rest import RESTClient\n"
    )
    assert nested == ({"RESTClient": ("kubernetes.client.rest", "RESTClient")}, {})


@pytest.mark.parametrize(
    "source",
    [
        "from .models import *\n",
        "import os\n",
        "if True:\n    from . import client\n",
        "x = make()\n",
    ],
)
def test_an_init_doing_anything_else_is_imported_as_usual(source: str) -> None:
    assert lazy_kubernetes.import_table("kubernetes", source) is None

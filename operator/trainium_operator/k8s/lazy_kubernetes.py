"""Import the Kubernetes client's packages lazily: what a process uses, not all of it.

`kubernetes/__init__.py`, `kubernetes.client`, `.client.api` and `.client.models` import every
API class and every model when first imported (about 850 modules): about 60 MiB of memory and a
second of start-up, of which the operator uses a few API classes and the models its responses
deserialise into. `install()` puts a finder first on `sys.meta_path` that loads those four
packages as modules whose names resolve on first access, each from the module the package's own
`__init__` would have imported it from (read from that file with `ast`, never executed). The
modules and classes are the library's own; only when they load changes.

Should a package's `__init__` hold anything this does not understand (a statement other than
`from X import Y` and plain assignments), that package is imported as usual: a newer client
that changes its layout costs memory, never correctness.
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The packages whose __init__ imports everything below them.
LAZY_PACKAGES = frozenset(
    {"kubernetes", "kubernetes.client", "kubernetes.client.api", "kubernetes.client.models"}
)
Table = dict[str, tuple[str, str | None]]  # name -> (module, attribute in it; None: the module)


def import_table(package: str, source: str) -> tuple[Table, dict[str, Any]] | None:
    """What `package`'s `__init__` (`source`) binds: each imported name's module and attribute,
    and the constants it assigns (`__version__`); None when it does anything else."""
    table: Table = {}
    constants: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the docstring
        if isinstance(node, ast.ImportFrom):
            if node.module == "__future__":
                continue
            base = _absolute(package, node.module, node.level)
            for alias in node.names:
                if alias.name == "*":
                    return None
                name = alias.asname or alias.name
                if node.module is None or base == package:
                    table[name] = (f"{base}.{alias.name}", None)  # from . import client
                else:
                    table[name] = (base, alias.name)
            continue
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Constant)
        ):
            constants[node.targets[0].id] = node.value.value
            continue
        return None
    return table, constants


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    base = ".".join(parts[: len(parts) - level + 1])
    return f"{base}.{module}" if module else base


class LazyPackage(types.ModuleType):
    """A package whose names load on first access (`_lazy_table`)."""

    _lazy_table: Table
    _lazy_lock: threading.RLock

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        table = self.__dict__.get("_lazy_table", {})
        if name not in table:
            try:
                return importlib.import_module(f"{self.__name__}.{name}")
            except ModuleNotFoundError:
                raise AttributeError(
                    f"module {self.__name__!r} has no attribute {name!r}"
                ) from None
        with self.__dict__["_lazy_lock"]:
            if name in self.__dict__:
                return self.__dict__[name]
            module_name, attribute = table[name]
            module = importlib.import_module(module_name)
            value = module if attribute is None else getattr(module, attribute)
            setattr(self, name, value)
            return value

    def __dir__(self) -> list[str]:
        return sorted({*self.__dict__, *self.__dict__.get("_lazy_table", {})})


class _LazyLoader(importlib.abc.Loader):
    def __init__(self, table: Table, constants: dict[str, Any]):
        self.table = table
        self.constants = constants

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return LazyPackage(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__.update(self.constants)
        module.__dict__["_lazy_table"] = self.table
        module.__dict__["_lazy_lock"] = threading.RLock()


class LazyFinder(importlib.abc.MetaPathFinder):
    """Finds LAZY_PACKAGES as lazy packages; every other module (and a package whose __init__
    it cannot read) the usual way."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in LAZY_PACKAGES:
            return None
        real = self._real_spec(fullname)
        if real is None or real.origin is None or real.submodule_search_locations is None:
            return real
        try:
            read = import_table(fullname, Path(real.origin).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError):
            read = None
        if read is None:
            return real
        spec = importlib.machinery.ModuleSpec(
            fullname, _LazyLoader(*read), origin=real.origin, is_package=True
        )
        spec.submodule_search_locations = list(real.submodule_search_locations)
        spec.has_location = True
        return spec

    def _real_spec(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            parent = fullname.rpartition(".")[0]
            path = sys.modules[parent].__path__ if parent else None
            spec: importlib.machinery.ModuleSpec | None = finder.find_spec(fullname, path)
            if spec is not None:
                return spec
        return None


def install() -> None:
    """Load the client's packages lazily from now on (a no-op when they are imported already:
    the process keeps what it has)."""
    if not any(isinstance(finder, LazyFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, LazyFinder())

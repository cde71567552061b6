"""Which Kubernetes API requests each component's code makes, read from the code itself.

Two AST passes, joined:
1. `k8s/*.py`: each method of the classes there (`Cluster`, `EventPoster`, `Reviews`) is mapped
   to the generated-client methods it calls or hands out. A generated method names its own
   request in its source (`call_api('/api/v1/namespaces/{namespace}/pods/{name}/log', 'GET')`),
   so path and HTTP method come from the client, not from parsing its method name; `{group}` and
   `{plural}` of the custom-object methods are resolved from the call's arguments (constants of
   our modules). A list function handed out without being called is what a `Reflector` runs:
   its verbs are the ones `Reflector` calls it with (a LIST, and a WATCH with `watch=True`).
2. a component's modules: which of those methods it reaches through the objects that hold them
   (`self.cluster.create`, `cluster.watch_sources`, `self.events.post`, ...), whether it runs
   `Reflector`s, and the resources of its `@kopf.on.event` handlers (kopf lists and watches each).

Every method also counts its requests (`counter.add(verb, resource)`, the API request metrics);
`counter_mismatches` checks those counts against the requests found, so the metrics stay honest.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from kubernetes import client

from chart.chart_harness import ROOT

PACKAGE = ROOT / "operator" / "trainium_operator"
K8S_MODULES = ("client", "informer", "reviews")
# The attributes through which component code holds each k8s class: how pass 2 recognises a
# call on one (`self.cluster.X`, `runtime.cluster.X`, `cluster.X`). The test checks that each
# class a component constructs is reached through its holder, so a renamed holder fails loudly.
HOLDERS = {"cluster": "Cluster", "events": "EventPoster", "reviews": "Reviews"}
# kopf decorators that start no resource watch. A handler kind not in this list or
# `on.event` (on.create, on.update, timers, daemons, ...) makes kopf also PATCH the resource
# (finalizers, progress annotations): `kopf_watches` refuses it so this module is extended.
KOPF_NON_RESOURCE_HANDLERS = {"login", "startup", "cleanup", "probe"}
_CALL_API = re.compile(r"call_api\(\s*'([^']+)',\s*'([A-Z]+)'")


@dataclass(frozen=True, order=True)
class ApiCall:
    """One RBAC permission a request needs: `resource` includes a subresource (`pods/log`)."""

    group: str
    resource: str
    verb: str

    def __str__(self) -> str:
        return f"{self.verb} {self.group or 'core'}/{self.resource}"


@dataclass(frozen=True)
class Request:
    """A generated-client method as one request: path template and HTTP method."""

    path: str
    http_method: str


@dataclass
class MethodCalls:
    """What one k8s-class method sends: `calls` directly, `list_functions` for a Reflector."""

    calls: set[ApiCall] = field(default_factory=set)
    list_functions: set[tuple[str, str]] = field(default_factory=set)  # (group, resource)
    counted: set[tuple[str, str | None]] = field(default_factory=set)  # (verb, resource|None)
    uses: set[str] = field(default_factory=set)  # other methods of its own class it calls
    namespaced: set[tuple[str, str]] = field(default_factory=set)  # addressed in a namespace


# --- the generated client ------------------------------------------------------------------


def api_classes() -> dict[str, type]:
    """The generated API classes our k8s modules instantiate (`client.CoreV1Api(...)`)."""
    names = {
        node.func.attr
        for module in K8S_MODULES
        for node in ast.walk(_parse(PACKAGE / "k8s" / f"{module}.py"))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr.endswith("Api")
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "client"
    }
    return {name: getattr(client, name) for name in sorted(names)}


@cache
def generated_methods() -> dict[str, Any]:
    """Every request method of those classes by name (a name is unique across them)."""
    methods: dict[str, Any] = {}
    for cls in api_classes().values():
        for name in dir(cls):
            if not name.startswith("_") and hasattr(cls, f"{name}_with_http_info"):
                methods[name] = getattr(cls, name)
    return methods


@cache
def request_of(method_name: str) -> Request:
    method = generated_methods()[method_name]
    source = inspect.getsource(getattr(type_of(method_name), f"{method_name}_with_http_info"))
    found = _CALL_API.findall(source)
    assert len(found) == 1, f"{method_name}: expected one call_api in its source, found {found}"
    path, http_method = found[0]
    assert method is not None
    return Request(path, http_method)


def type_of(method_name: str) -> type:
    for cls in api_classes().values():
        if hasattr(cls, method_name):
            return cls
    raise KeyError(method_name)


def parameters_of(method_name: str) -> list[str]:
    """Positional parameters, in order, without self and **kwargs."""
    signature = inspect.signature(generated_methods()[method_name])
    return [
        name
        for name, parameter in signature.parameters.items()
        if name != "self" and parameter.kind is parameter.POSITIONAL_OR_KEYWORD
    ]


def permission(request: Request, arguments: dict[str, str]) -> tuple[str, str, bool, bool]:
    """(group, resource[/subresource], whether the request names one object, whether it is in
    a namespace) of a request; `arguments` fill the path's {group} and {plural}."""
    segments = [
        arguments.get(s[1:-1], s) if s in ("{group}", "{plural}") else s
        for s in request.path.strip("/").split("/")
    ]
    if segments[0] == "api":  # /api/v1/...: the core group
        group, rest = "", segments[2:]
    else:  # /apis/<group>/<version>/...
        group, rest = segments[1], segments[3:]
    in_namespace = rest[:2] == ["namespaces", "{namespace}"] and len(rest) > 2
    if in_namespace:
        rest = rest[2:]
    unresolved = [s for s in [group, *rest] if s in ("{group}", "{plural}")]
    assert not unresolved, f"{request.path}: unresolved {unresolved} from {arguments}"
    resource, named, subresource = rest[0], len(rest) > 1, rest[2:]
    if subresource:
        resource = f"{resource}/{'/'.join(subresource)}"
    return group, resource, named, in_namespace


def verb_of(request: Request, *, named: bool, watch: bool) -> str:
    """The RBAC verb of a request, as the API server's request-info resolver assigns it."""
    if request.http_method == "GET":
        return "get" if named else ("watch" if watch else "list")
    if request.http_method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}[request.http_method]


@cache
def namespaced_resources() -> frozenset[tuple[str, str]]:
    """(group, resource) of every namespaced kind the installed client knows (a path under
    /namespaces/{namespace}/ exists for it): the chart puts those in per-namespace Roles."""
    found: set[tuple[str, str]] = set()
    api_dir = Path(client.__file__).parent / "api"
    for module in api_dir.glob("*_api.py"):
        for path, _ in _CALL_API.findall(module.read_text(encoding="utf-8")):
            segments = path.strip("/").split("/")
            if len(segments) < 3:  # discovery: /api/, /apis/<group>/
                continue
            group, rest = (
                ("", segments[2:]) if segments[0] == "api" else (segments[1], segments[3:])
            )
            if rest[:2] == ["namespaces", "{namespace}"] and len(rest) > 2:
                found.add((group, rest[2]))
    # Custom resources: those our code addresses under /namespaces/{namespace}/.
    for methods in k8s_methods().values():
        for calls in methods.values():
            found |= calls.namespaced
    return frozenset(found)


# --- pass 1: the k8s classes ----------------------------------------------------------------


@cache
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _evaluate(node: ast.expr, namespace: dict[str, Any]) -> str | None:
    """The value of a constant expression of a module (literal, module constant, f-string of
    those), or None when it depends on run-time values."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [
            _evaluate(v.value if isinstance(v, ast.FormattedValue) else v, namespace)
            for v in node.values
        ]
        return None if None in parts else "".join(p for p in parts if p is not None)
    if isinstance(node, ast.Name | ast.Attribute):
        dotted = ast.unparse(node)
        head, *tail = dotted.split(".")
        if head not in namespace:
            return None
        value: Any = namespace[head]
        for attribute in tail:
            value = getattr(value, attribute, None)
        return value if isinstance(value, str) else None
    return None


def _local_tuples(function: ast.FunctionDef) -> dict[str, list[ast.expr]]:
    """`name = (a, b)` assignments in a function: what `*name` in a call expands to."""
    tuples: dict[str, list[ast.expr]] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    tuples[target.id] = list(node.value.elts)
    return tuples


def _arguments(
    method_name: str,
    positional: list[ast.expr],
    keywords: list[ast.keyword],
    tuples: dict[str, list[ast.expr]],
    namespace: dict[str, Any],
) -> dict[str, str]:
    expanded: list[ast.expr] = []
    for argument in positional:
        if isinstance(argument, ast.Starred):
            assert isinstance(argument.value, ast.Name), ast.unparse(argument)
            expanded += tuples[argument.value.id]
        else:
            expanded.append(argument)
    bound = dict(zip(parameters_of(method_name), expanded, strict=False))
    bound |= {k.arg: k.value for k in keywords if k.arg is not None}
    values = {name: _evaluate(node, namespace) for name, node in bound.items()}
    return {name: value for name, value in values.items() if value is not None}


def _counted(call: ast.Call, namespace: dict[str, Any]) -> tuple[str, str | None] | None:
    """(verb, resource) of a `<...>counter.add(verb, resource)` call; resource None if dynamic."""
    func = call.func
    if not (
        isinstance(func, ast.Attribute)
        and func.attr == "add"
        and ast.unparse(func.value).endswith("counter")
    ):
        return None
    verb = _evaluate(call.args[0], namespace)
    assert verb is not None, f"counter.add with a verb that is not a constant: {ast.unparse(call)}"
    return verb, _evaluate(call.args[1], namespace)


def _method_calls(function: ast.FunctionDef, namespace: dict[str, Any]) -> MethodCalls:
    found = MethodCalls()
    parents = _parents(function)
    tuples = _local_tuples(function)
    methods = generated_methods()
    for node in ast.walk(function):
        if isinstance(node, ast.Call):
            counted = _counted(node, namespace)
            if counted is not None:
                found.counted.add(counted)
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and func.value.id == "self"
            ):
                found.uses.add(func.attr)
        if not (isinstance(node, ast.Attribute) and node.attr in methods):
            continue
        parent = parents.get(node)
        request = request_of(node.attr)
        if isinstance(parent, ast.Call) and parent.func is node:
            watch = any(
                k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in parent.keywords
            )
            arguments = _arguments(node.attr, parent.args, parent.keywords, tuples, namespace)
            group, resource, named, in_namespace = permission(request, arguments)
            if in_namespace:
                found.namespaced.add((group, resource.split("/")[0]))
            found.calls.add(ApiCall(group, resource, verb_of(request, named=named, watch=watch)))
            continue
        # Not called here: a list function handed out (maybe with arguments bound by partial).
        bound: tuple[list[ast.expr], list[ast.keyword]] = ([], [])
        if (
            isinstance(parent, ast.Call)
            and isinstance(parent.func, ast.Name)
            and parent.func.id == "partial"
            and parent.args[0] is node
        ):
            bound = (parent.args[1:], parent.keywords)
        arguments = _arguments(node.attr, *bound, tuples, namespace)
        group, resource, named, in_namespace = permission(request, arguments)
        if in_namespace:
            found.namespaced.add((group, resource))
        if request.http_method != "GET" or named:
            raise AssertionError(f"{function.name} hands out {node.attr}, not a list function")
        found.list_functions.add((group, resource))
    return found


@cache
def k8s_methods() -> dict[str, dict[str, MethodCalls]]:
    """{class: {method: what it sends, including through its own methods it calls}}."""
    classes: dict[str, dict[str, MethodCalls]] = {}
    for module_name in K8S_MODULES:
        module = importlib.import_module(f"trainium_operator.k8s.{module_name}")
        namespace = vars(module)
        for node in _parse(PACKAGE / "k8s" / f"{module_name}.py").body:
            if isinstance(node, ast.ClassDef):
                classes[node.name] = {
                    item.name: _method_calls(item, namespace)
                    for item in node.body
                    if isinstance(item, ast.FunctionDef)
                }
    for methods in classes.values():
        for calls in methods.values():
            pending, seen = list(calls.uses), set()
            while pending:
                name = pending.pop()
                if name in seen or name not in methods:
                    continue
                seen.add(name)
                calls.calls |= methods[name].calls
                calls.list_functions |= methods[name].list_functions
                pending += methods[name].uses
    return classes


@cache
def reflector_verbs() -> frozenset[str]:
    """The verbs a `Reflector` sends with the list function it is given: its `self._call(...)`
    calls, a WATCH where it passes watch=True, else a LIST."""
    verbs: set[str] = set()
    for node in ast.walk(_parse(PACKAGE / "k8s" / "informer.py")):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "self._call":
            watch = any(
                k.arg == "watch" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords
            )
            verbs.add("watch" if watch else "list")
    return frozenset(verbs)


def counter_mismatches() -> list[str]:
    """Methods whose request counters disagree with the requests they send."""
    problems: list[str] = []
    for class_name, methods in k8s_methods().items():
        for name, calls in methods.items():
            direct = _method_calls_direct(class_name, name)
            counted_verbs = {verb for verb, _ in calls.counted}
            sent_verbs = {call.verb for call in direct.calls}
            if sent_verbs != counted_verbs and (direct.calls or calls.counted):
                if class_name == "Reflector":
                    continue  # checked by reflector_counter_mismatches
                problems.append(f"{class_name}.{name}: sends {sent_verbs}, counts {counted_verbs}")
            for verb, resource in calls.counted:
                if resource is not None and (verb, resource) not in {
                    (c.verb, c.resource) for c in direct.calls
                }:
                    problems.append(
                        f"{class_name}.{name}: counts {verb} {resource}, sends "
                        f"{sorted(map(str, direct.calls))}"
                    )
    reflector_counted = {
        verb for calls in k8s_methods()["Reflector"].values() for verb, _ in calls.counted
    }
    if reflector_counted != reflector_verbs():
        problems.append(f"Reflector: sends {reflector_verbs()}, counts {reflector_counted}")
    return problems


def _method_calls_direct(class_name: str, name: str) -> MethodCalls:
    """A method's own requests, not those of the methods it calls (which count their own)."""
    for module_name in K8S_MODULES:
        module = importlib.import_module(f"trainium_operator.k8s.{module_name}")
        for node in _parse(PACKAGE / "k8s" / f"{module_name}.py").body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == name:
                        return _method_calls(item, vars(module))
    raise KeyError(f"{class_name}.{name}")


# --- pass 2: a component's code -------------------------------------------------------------


def component_files(*directories: str) -> list[Path]:
    return sorted(p for d in directories for p in (PACKAGE / d).rglob("*.py"))


def _trees(files: Iterable[Path]) -> Iterator[tuple[Path, ast.Module]]:
    for path in files:
        yield path, _parse(path)


def _holder_class(receiver: ast.expr) -> str | None:
    name = receiver.attr if isinstance(receiver, ast.Attribute) else getattr(receiver, "id", None)
    return HOLDERS.get(name) if isinstance(name, str) else None


def used_k8s_methods(files: Iterable[Path]) -> set[tuple[str, str]]:
    """(class, method) of every k8s-class method the files reach through a holder."""
    return set(_used_k8s_methods(tuple(files)))


# Each test asks about the same few file lists: each walk of their trees is done once.
@cache
def _used_k8s_methods(files: tuple[Path, ...]) -> frozenset[tuple[str, str]]:
    classes = k8s_methods()
    used: set[tuple[str, str]] = set()
    for _path, tree in _trees(files):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                holder = _holder_class(node.value)
                if holder is not None and node.attr in classes[holder]:
                    used.add((holder, node.attr))
    return frozenset(used)


def direct_client_uses(files: Iterable[Path]) -> list[str]:
    """Generated-client methods a component names itself, bypassing k8s/ (and this analysis)."""
    methods = generated_methods()
    return [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.attr}"
        for path, tree in _trees(files)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in methods
    ]


def constructs(files: Iterable[Path], class_name: str) -> bool:
    return _constructs(tuple(files), class_name)


@cache
def _constructs(files: tuple[Path, ...], class_name: str) -> bool:
    return any(
        isinstance(node, ast.Call) and ast.unparse(node.func) == class_name
        for _path, tree in _trees(files)
        for node in ast.walk(tree)
    )


def kopf_watches(files: Iterable[Path]) -> set[tuple[str, str]]:
    """(group, resource) of every `@kopf.on.event(group, version, plural)` handler."""
    return set(_kopf_watches(tuple(files)))


@cache
def _kopf_watches(files: tuple[Path, ...]) -> frozenset[tuple[str, str]]:
    watched: set[tuple[str, str]] = set()
    for path, tree in _trees(files):
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for decorator in node.decorator_list:
                call = decorator if isinstance(decorator, ast.Call) else None
                func = ast.unparse(call.func if call else decorator)
                if not func.startswith("kopf."):
                    continue
                kind = func.removeprefix("kopf.on.")
                if kind in KOPF_NON_RESOURCE_HANDLERS:
                    continue
                if kind != "event" or call is None:
                    raise AssertionError(
                        f"{path.relative_to(ROOT)}: @{func} makes kopf patch the resource too "
                        "(finalizers, progress annotations): teach code_api_calls about it"
                    )
                group, _version, plural = (
                    a.value for a in call.args if isinstance(a, ast.Constant)
                )
                watched.add((str(group), str(plural)))
    return frozenset(watched)


def component_calls(
    files: list[Path], *, without: frozenset[tuple[str, str]] = frozenset()
) -> set[ApiCall]:
    """Every permission the requests of a component's code need (kopf's own aside); `without`
    leaves out the (class, method)s of an opt-in, to find what only they send."""
    classes = k8s_methods()
    calls: set[ApiCall] = set()
    runs_reflectors = constructs(files, "Reflector")
    for holder, method in used_k8s_methods(files) - without:
        found = classes[holder][method]
        calls |= found.calls
        if found.list_functions:
            assert runs_reflectors, f"{holder}.{method}'s list functions run outside a Reflector"
        calls |= {
            ApiCall(group, resource, verb)
            for group, resource in found.list_functions
            for verb in reflector_verbs()
        }
    calls |= {
        ApiCall(group, resource, verb)
        for group, resource in kopf_watches(files)
        for verb in ("list", "watch")
    }
    return calls

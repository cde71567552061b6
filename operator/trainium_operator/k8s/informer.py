"""List-then-watch of one kind, as client-go's reflector does, over the kubernetes client.

Each `Reflector` LISTs its kind (paginated, with a server-side label selector so the operator
never holds objects that are not its own), reports every object, then WATCHes from the list's
resourceVersion with bookmarks. A watch that ends is resumed from the last version seen; one
the server has compacted away (410 Gone) or that fails is replaced by a fresh LIST, which also
reports what was deleted meanwhile. `synced` is set once the first LIST is reported, so a
consumer can tell "absent" from "not listed yet".
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes.watch.watch import iter_resp_lines

from trainium_operator.api.objects import Obj
from trainium_operator.k8s.client import RequestCounter

ObjKey = tuple[str, str]  # (namespace or "", name)
log = logging.getLogger(__name__)

LIST_PAGE = 500
WATCH_SECONDS = 300
# Client-side bounds: a LIST page that does not arrive, or a watch that stays silent past the
# server's own timeout (a half-open connection), ends in an error and a fresh LIST instead of
# freezing the cache while the process looks healthy.
CONNECT_TIMEOUT_SECONDS = 10
LIST_READ_TIMEOUT_SECONDS = 60
WATCH_READ_TIMEOUT_SECONDS = WATCH_SECONDS + 30
MAX_BACKOFF_SECONDS = 30.0


def without_managed_fields(obj: Obj) -> Obj:
    """`obj` without metadata.managedFields (server-side apply bookkeeping, often a third of a
    pod's JSON), which nothing in the operator reads: client-go's informers drop it the same
    way (a cache transform) to keep the cache small."""
    (obj.get("metadata") or {}).pop("managedFields", None)
    return obj


# What `ownership_only` keeps of an object's metadata.
OWNERSHIP_FIELDS = (
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "deletionTimestamp",
    "labels",
    "ownerReferences",
)


def ownership_only(obj: Obj) -> Obj:
    """`obj` reduced to whose it is: its identity, labels and owners (a cache transform for a
    kind the operator only checks exists and is the job's, as a Service: about a third of the
    memory of the whole object)."""
    meta = obj.get("metadata") or {}
    kept: Obj = {
        "metadata": {key: meta[key] for key in OWNERSHIP_FIELDS if key in meta},
    }
    for key in ("apiVersion", "kind"):
        if key in obj:
            kept[key] = obj[key]
    return kept


def ownership_and_status(obj: Obj) -> Obj:
    """`ownership_only` and the object's status (a kind the operator reads only the state of,
    as a Volcano PodGroup: its spec is what the operator wrote)."""
    kept = ownership_only(obj)
    if "status" in obj:
        kept["status"] = obj["status"]
    return kept


def object_key(obj: Obj) -> ObjKey:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def interrupt_read(response: Any) -> None:
    """Ends a read that another thread is blocked in on this streaming response, at once.

    Closing the response would wait for that read (the buffered reader's lock) until the next
    watch event or the server's timeout, minutes away; shutting the socket down makes the read
    return. The base class's shutdown is called on an SSL socket too: its own would also drop
    the TLS state under the reading thread."""
    connection = getattr(response, "connection", None) or getattr(response, "_connection", None)
    sock = getattr(connection, "sock", None)
    if isinstance(sock, socket.socket):
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)


class GoneError(RuntimeError):
    """The watch's resourceVersion is too old (410): only a new LIST can continue."""


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj


class Reflector:
    """Feeds `on_event` with every change of one kind; `call(**kwargs)` is a list function of
    the kubernetes client (namespaced or cluster-wide, with its positional arguments bound)."""

    def __init__(
        self,
        resource: str,
        call: Callable[..., Any],
        on_event: Callable[[WatchEvent], None],
        *,
        label_selector: str | None = None,
        counter: RequestCounter | None = None,
        accepts_namespace: Callable[[str], bool] | None = None,
        transform: Callable[[Obj], Obj] = without_managed_fields,
    ) -> None:
        self.resource = resource
        # Applied to every object before it is kept or handed on, as client-go's SetTransform.
        self._transform = transform
        # A cluster-wide watch narrowed to namespaces matching a pattern, on our side.
        self._accepts_namespace = accepts_namespace
        self._call = call
        self._on_event = on_event
        self._selector = label_selector
        self._counter = counter or RequestCounter()
        self._known: dict[ObjKey, Obj] = {}
        self._stop = threading.Event()
        self._response: Any = None
        self.synced = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"watch-{resource}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            interrupt_read(response)

    def _selector_kwargs(self) -> dict[str, Any]:
        return {"label_selector": self._selector} if self._selector else {}

    def _run(self) -> None:
        delay = 1.0
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._relist()
                    delay = 1.0
                version = self._watch(version)
            except GoneError:
                version = None  # relist at once
            except Exception as error:
                if self._stop.is_set():
                    return
                log.warning(
                    "watch of %s failed (%r); listing again in %.0f s", self.resource, error, delay
                )
                version = None
                self._stop.wait(delay)
                delay = min(delay * 2, MAX_BACKOFF_SECONDS)

    def _relist(self) -> str:
        items: list[Obj] = []
        token: str | None = None
        while True:
            self._counter.add("list", self.resource)
            kwargs: dict[str, Any] = {
                "limit": LIST_PAGE,
                "_request_timeout": (CONNECT_TIMEOUT_SECONDS, LIST_READ_TIMEOUT_SECONDS),
                **self._selector_kwargs(),
            }
            if token:
                kwargs["_continue"] = token
            page = json.loads(self._call(_preload_content=False, **kwargs).data)
            items.extend(self._transform(o) for o in page.get("items") or [] if self._accepts(o))
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                version = str(page["metadata"]["resourceVersion"])
                break
        listed = {object_key(o): o for o in items}
        for key in [k for k in self._known if k not in listed]:
            self._emit(WatchEvent("DELETED", self._known.pop(key)))
        for key, obj in listed.items():
            kind = "MODIFIED" if key in self._known else "ADDED"
            self._known[key] = obj
            self._emit(WatchEvent(kind, obj))
        if not self.synced.is_set():
            log.info("%s listed (%d objects); watching from there", self.resource, len(listed))
        self.synced.set()
        return version

    def _watch(self, version: str) -> str:
        self._counter.add("watch", self.resource)
        self._response = self._call(
            _preload_content=False,
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
            _request_timeout=(CONNECT_TIMEOUT_SECONDS, WATCH_READ_TIMEOUT_SECONDS),
            **self._selector_kwargs(),
        )
        try:
            for event in self._events(self._response):
                obj = event["object"]
                if event["type"] == "ERROR":
                    if obj.get("code") == 410:
                        raise GoneError(obj.get("message"))
                    raise RuntimeError(f"watch error: {obj.get('message')}")
                version = str(obj["metadata"]["resourceVersion"])
                if event["type"] == "BOOKMARK" or not self._accepts(obj):
                    continue
                obj = self._transform(obj)
                key = object_key(obj)
                if event["type"] == "DELETED":
                    self._known.pop(key, None)
                else:
                    self._known[key] = obj
                self._emit(WatchEvent(event["type"], obj))
        finally:
            self._response.release_conn()
            self._response = None
        return version

    def _accepts(self, obj: Obj) -> bool:
        if self._accepts_namespace is None:
            return True
        return self._accepts_namespace((obj.get("metadata") or {}).get("namespace") or "")

    @staticmethod
    def _events(response: Any) -> Iterator[Obj]:
        for line in iter_resp_lines(response):
            if line:
                yield json.loads(line)

    def _emit(self, event: WatchEvent) -> None:
        try:
            self._on_event(event)
        except Exception:
            log.exception("handling a %s event of %s failed", event.type, self.resource)

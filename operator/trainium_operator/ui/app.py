"""The profile web UI: an aiohttp app serving the static single-page UI and a JSON API.

Every number the browser shows comes from the analysis layer on the server; the browser
gets dashboards as small JSON documents and the timeline as windowed, level-of-detail
queries, never the raw profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from trainium_operator.analysis.report import annotation_of
from trainium_operator.analysis.s3store import S3ProfileSource
from trainium_operator.analysis.summary import RankChangedError
from trainium_operator.analysis.timeline import MAX_WIDTH_PX, MAX_WINDOW_TRACKS
from trainium_operator.k8s.reviews import ReviewedUser
from trainium_operator.profiler.format import ProfileFormatError
from trainium_operator.profiler.s3 import S3ProfileError
from trainium_operator.ui import lazy_timeline
from trainium_operator.ui.auth import (
    KubernetesAccess,
    Verdict,
    authentication_verdict,
    bearer_token,
    profile_namespace,
    profile_verdict,
)
from trainium_operator.ui.guards import (
    LOOPBACK_HOSTS,
    cross_origin_refusal,
    host_allowed,
)
from trainium_operator.ui.job_cache import JOB_LIST_TTL_S, SharedJobList
from trainium_operator.ui.limits import (
    DEFAULT_SUMMARISE_AHEAD,
    DEFAULT_SUMMARISE_WRITTEN_EVERY_S,
)
from trainium_operator.ui.memory import DEFAULT_MEMORY_BUDGET, OverBudgetError
from trainium_operator.ui.params import NS_LIMIT, ParameterError, clamped_int, int_set
from trainium_operator.ui.profile_id import InvalidProfileIdError, ProfileId, layout_namespace
from trainium_operator.ui.profiles import (
    JobInfo,
    JobLister,
    LoadedEntry,
    LoadSlot,
    ProfileNotLoadableError,
    ProfileStore,
    UnknownProfileError,
    matches,
)
from trainium_operator.ui.summary_cache import SummaryCache
from trainium_operator.ui.written import watch_written

log = logging.getLogger(__name__)

STORE_KEY = web.AppKey("store", ProfileStore)


@dataclass(frozen=True)
class _Jobs:
    lister: JobLister | None


@dataclass(frozen=True)
class _Security:
    allowed_hosts: frozenset[str]
    access: KubernetesAccess | None  # None: local mode, no authentication


JOBS_KEY = web.AppKey("jobs", _Jobs)
SECURITY_KEY = web.AppKey("security", _Security)
USER_KEY = web.RequestKey("user", ReviewedUser)  # kubernetes mode: the reviewed user
OPEN_WAIT_S = 2.0  # an open answers within this, loaded or with its progress
UNGUARDED_PATHS = frozenset({"/healthz"})  # probes: no Host, no token, nothing to read
STATIC_DIR = Path(str(resources.files("trainium_operator.ui") / "static"))
_SECURITY_HEADERS = {
    # Everything is served from here; nothing may load from elsewhere (offline by design).
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _store(request: web.Request) -> ProfileStore:
    return request.app[STORE_KEY]


def _param(request: web.Request, name: str) -> str:
    value = request.query.get(name)
    if value is None or value == "":
        raise web.HTTPBadRequest(text=f"missing query parameter {name!r}")
    return value


def _int_param(request: web.Request, name: str, *, low: int, high: int) -> int:
    try:
        return clamped_int(request.query, name, low=low, high=high)
    except ParameterError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc


def _refuse(verdict: Verdict) -> web.HTTPException:
    if verdict.status == 401:
        return web.HTTPUnauthorized(
            text=verdict.reason,
            headers={"WWW-Authenticate": 'Bearer realm="trainium-operator profile UI"'},
        )
    return web.HTTPForbidden(text=verdict.reason)


def _user(request: web.Request) -> ReviewedUser | None:
    user: ReviewedUser | None = request.get(USER_KEY)
    return user


async def _readable(request: web.Request, namespaces: Collection[str]) -> dict[str, bool]:
    """Which of these namespaces the request's user may read (all of them in local mode)."""
    access, user = request.app[SECURITY_KEY].access, _user(request)
    if access is None:
        return dict.fromkeys(namespaces, True)
    assert user is not None  # the authentication middleware set it
    try:
        return await access.readable(user, namespaces)
    except Exception as exc:  # the API server is unreachable: refuse, never show unchecked
        log.warning("SubjectAccessReview failed: %s", exc)
        raise web.HTTPServiceUnavailable(text="cannot review access now") from exc


def _store_key(store: ProfileStore, identifier: ProfileId) -> str | None:
    with contextlib.suppress(UnknownProfileError):
        return store.key(identifier)
    return None


async def _profile_key(request: web.Request) -> str:
    """The store key of the request's `id`: 400 for a malformed id; in kubernetes mode 404
    outside the operator's layout and 403 unless the user may read the namespace of the id
    and of the directory it resolves to (a symlink named like a readable namespace's profile
    must not open another namespace's); 404 for an id naming no profile."""
    raw = _param(request, "id")
    try:
        identifier = ProfileId.parse(raw)
    except InvalidProfileIdError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc
    store, user = _store(request), _user(request)
    checked = request.app[SECURITY_KEY].access is not None and user is not None
    if checked and identifier.namespace is None:
        raise web.HTTPNotFound(
            text=f"no profile {identifier.text!r}: the cluster UI serves only "
            "<namespace>/<job>/<attempt>[/on-demand/<id>]"
        )
    key = await asyncio.to_thread(_store_key, store, identifier)
    if checked:
        assert user is not None
        namespaces = {profile_namespace(identifier.text)}
        if key is not None:
            namespaces.add(profile_namespace(key))
        verdict = profile_verdict(user, await _readable(request, namespaces), namespaces)
        if not verdict.allowed:
            raise _refuse(verdict)
    if key is None:
        raise web.HTTPNotFound(text=f"no profile {identifier.text!r}")
    return key


async def _keyed_entry(request: web.Request) -> tuple[str, LoadedEntry]:
    key = await _profile_key(request)
    try:
        return key, await _store(request).wait_loaded(key)
    except UnknownProfileError as exc:
        raise web.HTTPNotFound(text=f"profile {key!r} is not loaded") from exc


async def _profile_entry(request: web.Request) -> LoadedEntry:
    return (await _keyed_entry(request))[1]


@contextlib.contextmanager
def _rank_decode_errors(key: str) -> Iterator[None]:
    """A rank the timeline decodes may have changed since its summary, or be too big."""
    try:
        yield
    except RankChangedError as exc:
        raise web.HTTPConflict(text=f"profile {key!r}: {exc}") from exc
    except ProfileFormatError as exc:  # rewritten since it was summarised: refused, with why
        raise web.HTTPUnprocessableEntity(text=f"profile {key!r}: {exc}") from exc
    except OverBudgetError as exc:
        raise web.HTTPInsufficientStorage(text=str(exc)) from exc


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC_DIR / "index.html")


async def list_profiles(request: web.Request) -> web.Response:
    """Every profile, with `?q=` (job name search) and `?status=` (status filter) applied.
    A row's status is its TrainingJob's phase when the cluster's job list names it, else the
    profile's own (Complete, Recording, or Incomplete for an S3 upload without manifest)."""
    store = _store(request)
    body: dict[str, Any] = {"root": store.root_label, "source": "s3" if store.s3 else "dir"}
    try:
        profiles = await asyncio.to_thread(store.listing)
    except S3ProfileError as exc:  # a missing bucket or a denied listing: say so, keep serving
        profiles = []
        body["profiles_error"] = str(exc)
    if request.app[SECURITY_KEY].access is not None:  # the cluster UI serves the layout only
        profiles = [row for row in profiles if layout_namespace(row["id"]) is not None]
    jobs, jobs_error = await _listed_jobs(request)
    if jobs_error is not None:
        body["jobs_error"] = jobs_error
    readable = await _readable(
        request,
        {profile_namespace(row["id"]) for row in profiles} | {job.namespace for job in jobs or []},
    )
    profiles = [row for row in profiles if readable[profile_namespace(row["id"])]]
    if jobs is not None:
        jobs = [job for job in jobs if readable[job.namespace]]
    store.discovered(profiles)  # what this user may open is summarised ahead of the open
    for row in profiles:
        row["summaries"] = store.ahead.status(row["id"])
    phases = {(job.namespace, job.name): job.status for job in jobs or []}
    for row in profiles:
        row["status"] = phases.get((row["namespace"], row["job_name"]), row["profile_status"])
    query, status = request.query.get("q", ""), request.query.get("status", "")
    body["statuses"] = sorted({row["status"] for row in profiles})
    body["total"] = len(profiles)
    body["profiles"] = [row for row in profiles if matches(row, query, status)]
    body["jobs"] = None if jobs is None else _job_rows(store, jobs, query, status)
    return web.json_response(body)


async def list_jobs(request: web.Request) -> web.Response:
    """The TrainingJobs alone, with their live progress and health, for the list's polling
    (`?q=` and `?status=` as for /api/profiles): no profile listing, so it stays cheap."""
    body: dict[str, Any] = {"jobs": None}
    jobs, jobs_error = await _listed_jobs(request)
    if jobs_error is not None:
        body["jobs_error"] = jobs_error
    if jobs is not None:
        readable = await _readable(request, {job.namespace for job in jobs})
        query, status = request.query.get("q", ""), request.query.get("status", "")
        visible = [job for job in jobs if readable[job.namespace]]
        body["jobs"] = _job_rows(_store(request), visible, query, status)
        named = [row["profile_id"] for row in body["jobs"] if row["profile_id"] is not None]
        _store(request).discovered([], named)
    return web.json_response(body)


async def _listed_jobs(request: web.Request) -> tuple[list[JobInfo] | None, str | None]:
    """The lister's jobs (None without a lister), or why they could not be listed."""
    lister = request.app[JOBS_KEY].lister
    if lister is None:
        return None, None
    try:
        return await lister(), None
    except Exception as exc:  # the profile list is still useful without the cluster
        log.warning("listing TrainingJobs failed: %s", exc)
        return None, f"{type(exc).__name__}: {exc}"


def _job_rows(
    store: ProfileStore, jobs: list[JobInfo], query: str, status: str
) -> list[dict[str, Any]]:
    rows = [_job_row(store, job) for job in jobs]
    return [
        row
        for row in rows
        if matches(
            {
                "namespace": row["namespace"],
                "job_name": row["name"],
                "id": "",
                "status": row["status"],
            },
            query,
            status,
        )
    ]


def _job_row(store: ProfileStore, job: JobInfo) -> dict[str, Any]:
    return {
        "name": job.name,
        "namespace": job.namespace,
        "created": job.created,
        "status": job.status,
        "profiling": job.profiling,
        "profile_id": store.id_for(job.profile_path, job.profile_s3_uri),
        **dataclasses.asdict(job.live),
    }


async def _start_load(request: web.Request) -> tuple[ProfileStore, str, LoadSlot]:
    key = await _profile_key(request)
    store = _store(request)
    try:
        return store, key, await store.load(key)
    except UnknownProfileError as exc:
        raise web.HTTPNotFound(text=f"no profile {key!r}") from exc
    except ProfileNotLoadableError as exc:
        raise web.HTTPConflict(text=f"profile {key!r} cannot be loaded: {exc}") from exc
    except S3ProfileError as exc:
        raise web.HTTPBadGateway(text=str(exc)) from exc


def _check_settled(store: ProfileStore, key: str, slot: LoadSlot) -> None:
    if store.slots.get(key) is not slot:
        raise web.HTTPConflict(text=f"profile {key!r} was unloaded while it loaded")
    if slot.state == "error":  # a malformed profile: the client's input, not a server fault
        raise web.HTTPUnprocessableEntity(text=f"profile {key!r}: {slot.error}")


async def load(request: web.Request) -> web.Response:
    store, key, slot = await _start_load(request)
    if request.query.get("wait") == "1":
        await store.settled(slot)
    _check_settled(store, key, slot)
    return web.json_response({"id": key, "state": slot.state, "error": slot.error})


async def open_profile(request: web.Request) -> web.Response:
    """Loads the profile and answers its dashboard (200) once it is loaded; while it is still
    loading after OPEN_WAIT_S, 202 with how far it is (summarising its rank files), and the
    page asks again: an open never holds a request, or the server, for long."""
    store, key, slot = await _start_load(request)
    await store.settled(slot, timeout=OPEN_WAIT_S)
    _check_settled(store, key, slot)
    if slot.entry is None:
        progress = slot.progress.as_dict()
        return web.json_response({"id": key, "state": slot.state, "progress": progress}, status=202)
    return _document(request, slot.entry)


def _document(request: web.Request, entry: LoadedEntry) -> web.Response:
    """The dashboard as encoded at load, compressed when the browser takes gzip (every one
    does): a fifth of the bytes, which matters through a port-forward."""
    stored = entry.stored
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        headers = {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
        return web.Response(body=stored.gzipped, content_type="application/json", headers=headers)
    return web.Response(body=stored.body, content_type="application/json")


async def unload(request: web.Request) -> web.Response:
    key = await _profile_key(request)
    return web.json_response({"id": key, "unloaded": _store(request).unload(key)})


async def get_dashboard(request: web.Request) -> web.Response:
    entry = await _profile_entry(request)
    return _document(request, entry)


async def get_annotation(request: web.Request) -> web.Response:
    key, entry = await _keyed_entry(request)
    name = _param(request, "name")
    ready = entry.stored.annotations.get(name)
    if ready is not None:  # composed with the dashboard: no summaries to read
        return web.json_response(ready)
    samples = (await _store(request).composed(key, entry)).inputs.samples
    return web.json_response(await asyncio.to_thread(annotation_of, samples, name))


async def get_tracks(request: web.Request) -> web.Response:
    key, entry = await _keyed_entry(request)
    composed = await _store(request).composed(key, entry)
    inputs = composed.inputs
    return web.json_response(
        {
            "names": list(inputs.samples.names),
            "nodes": lazy_timeline.tree(composed),
            "end_ns": inputs.end_ns,
            "origin_wall_ns": inputs.origin_wall_ns,
            "steps": [
                {"step": row["step"], "start_ns": row["start_ns"], "end_ns": row["end_ns"]}
                for row in entry.dashboard["steps"]["rows"]
            ],
        }
    )


async def get_window(request: web.Request) -> web.Response:
    key, entry = await _keyed_entry(request)
    start = _int_param(request, "start", low=-NS_LIMIT, high=NS_LIMIT)
    end = _int_param(request, "end", low=-NS_LIMIT, high=NS_LIMIT)
    width = _int_param(request, "width", low=1, high=MAX_WIDTH_PX)
    try:
        track_ids = int_set(
            request.query,
            "tracks",
            low=0,
            high=len((await _store(request).composed(key, entry)).tracks) - 1,
            max_items=MAX_WINDOW_TRACKS,
        )
    except ParameterError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from exc
    with _rank_decode_errors(key):
        result = await _store(request).window(key, entry, (start, end), width, track_ids)
    return web.json_response(result)


async def get_event(request: web.Request) -> web.Response:
    key, entry = await _keyed_entry(request)
    event_id = _int_param(request, "event", low=-1, high=NS_LIMIT)
    with _rank_decode_errors(key):
        detail = await _store(request).event(key, entry, event_id)
    if detail is None:
        raise web.HTTPNotFound(text="no such event")
    return web.json_response(detail)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


@web.middleware
async def security_headers(request: web.Request, handler: Any) -> web.StreamResponse:
    response: web.StreamResponse = await handler(request)
    response.headers.update(_SECURITY_HEADERS)
    if request.path.startswith("/api/"):
        response.headers["Cache-Control"] = "no-store"
    return response


@web.middleware
async def request_guard(request: web.Request, handler: Any) -> web.StreamResponse:
    """The Host check (DNS rebinding) and the CSRF defence (guards.py), before anything else."""
    if request.path not in UNGUARDED_PATHS:
        host = request.headers.get("Host")
        if not host_allowed(host, request.app[SECURITY_KEY].allowed_hosts):
            raise web.HTTPMisdirectedRequest(
                text=f"this UI is not served as {host!r} (allow it with --allowed-host)"
            )
        refusal = cross_origin_refusal(request.method, request.headers)
        if refusal is not None:
            raise web.HTTPForbidden(text=refusal)
    response: web.StreamResponse = await handler(request)
    return response


@web.middleware
async def authenticate(request: web.Request, handler: Any) -> web.StreamResponse:
    """Kubernetes mode: every request but the probe's names an authenticated user."""
    access = request.app[SECURITY_KEY].access
    if access is not None and request.path not in UNGUARDED_PATHS:
        token = bearer_token(request.headers.get("Authorization"))
        review = None
        if token is not None:
            try:
                review = await access.authenticate(token)
            except Exception as exc:  # the API server is unreachable: not the user's fault
                log.warning("TokenReview failed: %s", exc)
                raise web.HTTPServiceUnavailable(text="cannot review the token now") from exc
        verdict = authentication_verdict(token, review)
        if not verdict.allowed:
            raise _refuse(verdict)
        assert review is not None
        assert review.user is not None
        request[USER_KEY] = review.user
    response: web.StreamResponse = await handler(request)
    return response


def _watching_written(
    store: ProfileStore, jobs: SharedJobList, interval: float
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def watching(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(watch_written(store, jobs, interval))
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return watching


def create_app(
    root: str | Path,
    job_lister: JobLister | None = None,
    workers: int | None = None,
    s3: S3ProfileSource | None = None,
    *,
    allowed_hosts: Collection[str] = LOOPBACK_HOSTS,
    access: KubernetesAccess | None = None,
    job_list_ttl: float = JOB_LIST_TTL_S,
    summary_cache: SummaryCache | None = None,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
    summarise_ahead: int = DEFAULT_SUMMARISE_AHEAD,
    summarise_written_every: float = DEFAULT_SUMMARISE_WRITTEN_EVERY_S,
) -> web.Application:
    """The UI for profiles under `root`, a directory or an `s3://bucket/prefix` URI.
    `job_lister` lists the TrainingJobs (injected so this module never imports
    the Kubernetes client), at most once per `job_list_ttl` seconds for all requests together;
    `s3` overrides the S3 source (client, cache) for an s3:// root.
    `allowed_hosts` are the names the UI answers to (`*`: any); with `access`, every request
    needs a bearer token the cluster authenticates and sees only namespaces its user may read.
    `summary_cache` keeps rank summaries across loads and restarts (None: in memory only, per
    load); `memory_budget` bounds the loaded profiles and decoded ranks held (bytes);
    `summarise_ahead` profiles a listing discovers may wait to be summarised in the background
    (0: only when opened); with a `job_lister`, every `summarise_written_every` seconds the
    profiles the jobs' statuses show written are queued there too (`ui.written`; 0: not)."""
    app = web.Application(middlewares=[security_headers, request_guard, authenticate])
    store = ProfileStore.for_source(
        root,
        workers=workers,
        s3=s3,
        cache=summary_cache,
        memory_budget=memory_budget,
        summarise_ahead=summarise_ahead,
    )
    app[STORE_KEY] = store

    async def stop_workers(app: web.Application) -> None:
        await store.aclose()

    app.on_cleanup.append(stop_workers)
    shared_jobs = None if job_lister is None else SharedJobList(job_lister, job_list_ttl)
    app[JOBS_KEY] = _Jobs(shared_jobs)
    if shared_jobs is not None and summarise_written_every > 0 and summarise_ahead > 0:
        app.cleanup_ctx.append(_watching_written(store, shared_jobs, summarise_written_every))
    app[SECURITY_KEY] = _Security(frozenset(allowed_hosts), access)
    app.router.add_get("/", index)
    app.router.add_get("/api/profiles", list_profiles)
    app.router.add_get("/api/jobs", list_jobs)
    app.router.add_post("/api/profiles/load", load)
    app.router.add_post("/api/profiles/open", open_profile)
    app.router.add_post("/api/profiles/unload", unload)
    app.router.add_get("/api/dashboard", get_dashboard)
    app.router.add_get("/api/annotation", get_annotation)
    app.router.add_get("/api/tracks", get_tracks)
    app.router.add_get("/api/window", get_window)
    app.router.add_get("/api/event", get_event)
    app.router.add_get("/healthz", healthz)
    app.router.add_static("/static/", STATIC_DIR, follow_symlinks=False)
    return app

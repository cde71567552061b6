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
from collections.abc import Collection
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from trainium_operator.analysis.report import annotation
from trainium_operator.analysis.s3store import S3ProfileSource
from trainium_operator.k8s.reviews import ReviewedUser
from trainium_operator.profiler.s3 import S3ProfileError
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
from trainium_operator.ui.profiles import (
    JobInfo,
    JobLister,
    ProfileNotLoadableError,
    ProfileStore,
    UnknownProfileError,
    matches,
    profile_id,
)

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


def _int_param(request: web.Request, name: str) -> int:
    try:
        return int(float(_param(request, name)))
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"{name} must be a number") from exc


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


def _profile_namespaces(store: ProfileStore, identifier: str) -> set[str]:
    """The namespace of the id, and of the directory it resolves to (a symlink named like a
    readable namespace's profile must not open another namespace's)."""
    namespaces = {profile_namespace(identifier)}
    if store.s3 is None:
        # An unknown id is answered 404 by the handler, once its own namespace was allowed.
        with contextlib.suppress(UnknownProfileError):
            namespaces.add(profile_namespace(profile_id(store.root, store.resolve(identifier))))
    return namespaces


async def _authorize_profile(request: web.Request, identifier: str) -> None:
    """403 unless the user may read the namespace the profile belongs to."""
    user = _user(request)
    if request.app[SECURITY_KEY].access is None or user is None:
        return
    namespaces = await asyncio.to_thread(_profile_namespaces, _store(request), identifier)
    verdict = profile_verdict(user, await _readable(request, namespaces), namespaces)
    if not verdict.allowed:
        raise _refuse(verdict)


async def _profile_entry(request: web.Request) -> Any:
    identifier = _param(request, "id")
    await _authorize_profile(request, identifier)
    try:
        return await _store(request).wait_loaded(identifier)
    except UnknownProfileError as exc:
        raise web.HTTPNotFound(text=f"profile {identifier!r} is not loaded") from exc


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


async def load(request: web.Request) -> web.Response:
    identifier = _param(request, "id")
    await _authorize_profile(request, identifier)
    try:
        slot = await _store(request).load(identifier)
    except UnknownProfileError as exc:
        raise web.HTTPNotFound(text=f"no profile {identifier!r}") from exc
    except ProfileNotLoadableError as exc:
        raise web.HTTPConflict(text=f"profile {identifier!r} cannot be loaded: {exc}") from exc
    except S3ProfileError as exc:
        raise web.HTTPBadGateway(text=str(exc)) from exc
    if request.query.get("wait") == "1" and slot.task is not None:
        await asyncio.shield(slot.task)
    if slot.state == "error":  # a malformed profile: the client's input, not a server fault
        raise web.HTTPUnprocessableEntity(text=f"profile {identifier!r}: {slot.error}")
    return web.json_response({"id": identifier, "state": slot.state, "error": slot.error})


async def unload(request: web.Request) -> web.Response:
    identifier = _param(request, "id")
    await _authorize_profile(request, identifier)
    return web.json_response({"id": identifier, "unloaded": _store(request).unload(identifier)})


async def get_dashboard(request: web.Request) -> web.Response:
    entry = await _profile_entry(request)
    return web.json_response(entry.dashboard)


async def get_annotation(request: web.Request) -> web.Response:
    entry = await _profile_entry(request)
    name = _param(request, "name")
    return web.json_response(await asyncio.to_thread(annotation, entry.profile, name))


async def get_tracks(request: web.Request) -> web.Response:
    entry = await _profile_entry(request)
    index = entry.index
    return web.json_response(
        {
            "names": list(index.columns.names),
            "nodes": index.tree(),
            "end_ns": entry.profile.end_ns,
            "origin_wall_ns": entry.profile.origin_wall_ns,
            "steps": [
                {"step": row["step"], "start_ns": row["start_ns"], "end_ns": row["end_ns"]}
                for row in entry.dashboard["steps"]["rows"]
            ],
        }
    )


async def get_window(request: web.Request) -> web.Response:
    entry = await _profile_entry(request)
    start = _int_param(request, "start")
    end = _int_param(request, "end")
    width = _int_param(request, "width")
    raw_tracks = request.query.get("tracks", "")
    try:
        track_ids = [int(part) for part in raw_tracks.split(",") if part]
    except ValueError as exc:
        raise web.HTTPBadRequest(text="tracks must be comma-separated integers") from exc
    result = await asyncio.to_thread(entry.index.window, start, end, width, track_ids)
    return web.json_response(result)


async def get_event(request: web.Request) -> web.Response:
    entry = await _profile_entry(request)
    detail = entry.index.event(_int_param(request, "event"))
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


def create_app(
    root: str | Path,
    job_lister: JobLister | None = None,
    workers: int | None = None,
    s3: S3ProfileSource | None = None,
    *,
    allowed_hosts: Collection[str] = LOOPBACK_HOSTS,
    access: KubernetesAccess | None = None,
) -> web.Application:
    """The UI for profiles under `root`, a directory or an `s3://bucket/prefix` URI.
    `job_lister` lists the TrainingJobs (injected so this module never imports
    the Kubernetes client); `s3` overrides the S3 source (client, cache) for an s3:// root.
    `allowed_hosts` are the names the UI answers to (`*`: any); with `access`, every request
    needs a bearer token the cluster authenticates and sees only namespaces its user may read."""
    app = web.Application(middlewares=[security_headers, request_guard, authenticate])
    app[STORE_KEY] = ProfileStore.for_source(root, workers=workers, s3=s3)
    app[JOBS_KEY] = _Jobs(job_lister)
    app[SECURITY_KEY] = _Security(frozenset(allowed_hosts), access)
    app.router.add_get("/", index)
    app.router.add_get("/api/profiles", list_profiles)
    app.router.add_get("/api/jobs", list_jobs)
    app.router.add_post("/api/profiles/load", load)
    app.router.add_post("/api/profiles/unload", unload)
    app.router.add_get("/api/dashboard", get_dashboard)
    app.router.add_get("/api/annotation", get_annotation)
    app.router.add_get("/api/tracks", get_tracks)
    app.router.add_get("/api/window", get_window)
    app.router.add_get("/api/event", get_event)
    app.router.add_get("/healthz", healthz)
    app.router.add_static("/static/", STATIC_DIR, follow_symlinks=False)
    return app

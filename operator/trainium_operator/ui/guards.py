"""Request safety of the profile UI, in every mode: the Host check and the CSRF defence.

- **Host**: a request whose `Host` is not one the UI is known by is refused (421), so a page
  on a DNS-rebound name (evil.example resolving to 127.0.0.1) cannot read or drive the UI from
  the user's browser. The default list is the bound address plus the loopback names.
- **CSRF**: state changes are POST only (the router answers 405 to GET), and a POST must carry
  the `X-Trainium-UI` header. A browser sends a custom header cross-origin only after a CORS
  preflight, which this server never approves, so another site cannot forge one; a form or an
  image tag cannot set headers at all. As defence in depth, a POST whose Fetch-Metadata
  (`Sec-Fetch-Site`) or `Origin` says it comes from another origin is refused too.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from urllib.parse import urlsplit

CSRF_HEADER = "X-Trainium-UI"
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})
ANY_HOST = "*"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_SAME_ORIGIN_FETCH_SITES = frozenset({"same-origin", "none"})  # "none": typed URL, bookmark


def default_allowed_hosts(bind_host: str) -> tuple[str, ...]:
    """The bound address (unless it is a wildcard: then nothing names it) and loopback."""
    bound = () if bind_host in WILDCARD_BINDS else (bind_host,)
    return tuple(dict.fromkeys((*bound, *LOOPBACK_HOSTS)))


def host_name(host_header: str) -> str:
    """The name part of a Host header, lowercased: `a.b:8080` -> `a.b`, `[::1]:80` -> `::1`."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") > 1:  # a bare IPv6 address (not a valid Host, but unambiguous)
        return value
    return value.partition(":")[0].rstrip(".")


def host_allowed(host_header: str | None, allowed: Collection[str]) -> bool:
    if ANY_HOST in allowed:
        return True
    if not host_header:
        return False
    name = host_name(host_header)
    return bool(name) and name in {host_name(entry) for entry in allowed}


def cross_origin_refusal(method: str, headers: Mapping[str, str]) -> str | None:
    """Why a request must be refused as a possible cross-site forgery, or None."""
    if method.upper() in SAFE_METHODS:
        return None
    if not headers.get(CSRF_HEADER):
        return f"a {method} must carry the {CSRF_HEADER} header (the UI's pages send it)"
    site = headers.get("Sec-Fetch-Site")
    if site is not None and site.lower() not in _SAME_ORIGIN_FETCH_SITES:
        return f"a {method} from another site (Sec-Fetch-Site: {site}) is refused"
    origin = headers.get("Origin")
    if origin is not None:
        origin_host = urlsplit(origin).netloc.lower() if origin != "null" else ""
        if not origin_host or origin_host != (headers.get("Host") or "").lower():
            return f"a {method} from origin {origin!r} is refused (not this server's)"
    return None

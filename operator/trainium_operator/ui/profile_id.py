"""Profile ids: how the browser names a profile, parsed once into one canonical form.

An id is a path relative to the UI's root (a directory or an S3 prefix). Spellings of one path
(`ns/j/0`, `ns/j/0/`, `./ns/j/0`, `ns//j/0`) parse to the same id, so they are one profile to
the store and to authorization. The operator's layout names where a profile belongs:

- `<namespace>/<job>/<attempt>`: an attempt's profile;
- `<namespace>/<job>/<attempt>/on-demand/<request id>`: an on-demand capture of that attempt.

The namespace is always the first segment of that layout, never what the profile's manifest
(written by the training pod) says. An id outside the layout has no namespace: the cluster UI
(`--auth kubernetes`) serves none; a local UI serves any path under its root. Ids come from
users: a malformed one (`..`, NUL, backslash, control characters, too long, too deep) is
refused before it reaches a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainium_operator.api.object_names import LABEL_PATTERN
from trainium_operator.api.spec import JOB_NAME_PATTERN, MAX_JOB_NAME_LENGTH
from trainium_operator.contract.channel import ON_DEMAND_SUBDIR, valid_request_id

MAX_ID_CHARS = 512
MAX_ID_PARTS = 16  # the directory search depth (8) with room for on-demand captures below it
MAX_NAMESPACE_CHARS = 63
MAX_ATTEMPT_DIGITS = 9
ROOT_ID = "."  # the root itself is a profile (`profile serve <one profile directory>`)
_NAMESPACE = re.compile(LABEL_PATTERN)
_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")


class InvalidProfileIdError(ValueError):
    """The id cannot name a profile (a 400, not a lookup)."""


@dataclass(frozen=True, slots=True)
class ProfileId:
    """A canonical profile id; `namespace` is None outside the operator's layout."""

    parts: tuple[str, ...]
    namespace: str | None = None
    job: str | None = None
    attempt: int | None = None
    capture: str | None = None  # the on-demand request id

    @property
    def text(self) -> str:
        return "/".join(self.parts) or ROOT_ID

    @property
    def in_layout(self) -> bool:
        return self.namespace is not None

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, raw: str) -> ProfileId:
        """The id `raw` spells, or InvalidProfileIdError."""
        if len(raw) > MAX_ID_CHARS:
            raise InvalidProfileIdError(f"a profile id is at most {MAX_ID_CHARS} characters")
        if _CONTROL.search(raw):
            raise InvalidProfileIdError("a profile id has no control characters or backslashes")
        parts = tuple(part for part in raw.split("/") if part not in ("", "."))
        if ".." in parts:
            raise InvalidProfileIdError("a profile id has no '..' component")
        if len(parts) > MAX_ID_PARTS:
            raise InvalidProfileIdError(f"a profile id has at most {MAX_ID_PARTS} components")
        return cls._in_layout(parts) or cls(parts)

    @classmethod
    def _in_layout(cls, parts: tuple[str, ...]) -> ProfileId | None:
        if len(parts) == 3:
            capture = None
        elif len(parts) == 5 and parts[3] == ON_DEMAND_SUBDIR and valid_request_id(parts[4]):
            capture = parts[4]
        else:
            return None
        namespace, job, attempt = parts[:3]
        if not (
            len(namespace) <= MAX_NAMESPACE_CHARS
            and _NAMESPACE.match(namespace)
            and len(job) <= MAX_JOB_NAME_LENGTH
            and JOB_NAME_PATTERN.match(job)
            and attempt.isascii()
            and attempt.isdigit()
            and len(attempt) <= MAX_ATTEMPT_DIGITS
        ):
            return None
        return cls(parts, namespace, job, int(attempt), capture)


def layout_namespace(identifier: str) -> str | None:
    """The namespace of an id in the operator's layout; None for any other or malformed id."""
    try:
        return ProfileId.parse(identifier).namespace
    except InvalidProfileIdError:
        return None

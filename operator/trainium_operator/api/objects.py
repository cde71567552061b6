"""The one alias for a Kubernetes object (or a part of one) as JSON: what the API server
returns, what the builders produce and what the status is stored as."""

from __future__ import annotations

from typing import Any

Obj = dict[str, Any]

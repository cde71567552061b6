"""Run a program with exactly a ServiceAccount's permissions: a kubeconfig with its token.

The demo and the RBAC tests run the operator this way, so it holds only what the Helm
chart's RBAC grants (a missing rule shows up as a 403, as it would in a cluster).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trainium_devcluster.clients import Clients


def service_account_kubeconfig(
    clients: Clients,
    admin_kubeconfig: Path,
    *,
    namespace: str,
    service_account: str,
    output: Path,
    expiration_seconds: int = 4 * 3600,
) -> Path:
    """Writes a kubeconfig that authenticates as system:serviceaccount:<namespace>:<name>."""
    request = {"spec": {"expirationSeconds": expiration_seconds, "audiences": []}}
    token = clients.core.create_namespaced_service_account_token(
        service_account, namespace, request
    ).status.token
    admin: dict[str, Any] = yaml.safe_load(admin_kubeconfig.read_text())
    context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])
    cluster = next(c for c in admin["clusters"] if c["name"] == context["context"]["cluster"])
    cluster_spec = dict(cluster["cluster"])
    ca_path = cluster_spec.get("certificate-authority")
    if ca_path and not Path(ca_path).is_absolute():
        cluster_spec["certificate-authority"] = str((admin_kubeconfig.parent / ca_path).resolve())
    user = f"{namespace}-{service_account}"
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster["name"], "cluster": cluster_spec}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {
                "name": user,
                "context": {"cluster": cluster["name"], "user": user, "namespace": namespace},
            }
        ],
        "current-context": user,
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(yaml.safe_dump(config, sort_keys=False))
    output.chmod(0o600)
    return output

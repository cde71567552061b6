"""The local dev cluster: a real Kubernetes control plane (KWOK), the real Volcano processes, fake
Trainium nodes and the demo. A developer tool beside the operator: importable from a checkout,
never part of the operator's wheel or image."""

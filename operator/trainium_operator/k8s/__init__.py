"""k8s layer."""

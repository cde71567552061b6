"""ui layer.

The UI server loads the Kubernetes client's API classes and models as it uses them
(k8s.lazy_kubernetes), as the operator does."""

from trainium_operator.k8s import lazy_kubernetes

lazy_kubernetes.install()

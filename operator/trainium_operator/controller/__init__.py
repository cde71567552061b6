"""controller layer.

The operator process loads the Kubernetes client's API classes and models as it uses them
(k8s.lazy_kubernetes): the whole client costs about 60 MiB and a second of start-up."""

from trainium_operator.k8s import lazy_kubernetes

lazy_kubernetes.install()

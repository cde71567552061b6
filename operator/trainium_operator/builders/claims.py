"""The ResourceClaimTemplate of a job whose pods get their devices through DRA (pure).

One template per job, `<job>-devices`, owned by the TrainingJob (garbage-collected with it):
every pod of every stage and attempt names it, and the resource-claim controller makes each pod
its own ResourceClaim from it (owned by the pod). One template suffices because everything it
is built from (spec.instanceType, spec.lnc, spec.deviceAllocation) is immutable. Its shape is
the one AWS documents (api/dra.py): the instance type's Neuron devices as one connected group
and its EFA interfaces, in one claim with one matchAttribute constraint over both, and on
Trainium2 the job's LNC as the claim's opaque NeuronConfig. Every count is the instance type's
(api/instance_types.py): nothing in it comes from the job author but the choice of type and LNC.
"""

from __future__ import annotations

from trainium_operator.api import dra
from trainium_operator.api.instance_types import INSTANCE_TYPES, InstanceType
from trainium_operator.api.objects import Obj
from trainium_operator.api.spec import DeviceAllocation
from trainium_operator.builders.job import JobRef


def uses_dra(job: JobRef) -> bool:
    return job.spec.device_allocation is DeviceAllocation.DRA


def template_name(job: JobRef) -> str:
    return f"{job.name}-devices"


def _neuron_request(shape: InstanceType) -> Obj:
    # ExactCount, never `All`: Kueue counts a claim's devices only in that mode (pkg/dra/
    # claims.go: "AllocationMode 'All' is not supported"), and a count says what the quota holds.
    return {
        "name": dra.NEURON_REQUEST,
        "exactly": {
            "deviceClassName": dra.NEURON_DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": shape.neuron_devices,
            "selectors": [
                {
                    "cel": {
                        "expression": f"device.attributes['{dra.NEURON_DRIVER}'].instanceType "
                        f"== '{shape.name}'"
                    }
                }
            ],
        },
    }


def _efa_request(shape: InstanceType) -> Obj:
    return {
        "name": dra.EFA_REQUEST,
        "exactly": {
            "deviceClassName": dra.EFA_DEVICE_CLASS,
            "allocationMode": "ExactCount",
            "count": shape.efa_interfaces,
        },
    }


def claim_spec(shape: InstanceType, lnc: int | None) -> Obj:
    """The ResourceClaimSpec of one pod: the whole instance as one connected group."""
    requests = [_neuron_request(shape)]
    devices: Obj = {"requests": requests}
    group = dra.connected_group_size(shape.neuron_devices)
    if shape.efa_interfaces:
        requests.append(_efa_request(shape))
        # The devicegroup ids are published on EFA-enabled instances only (Neuron DRA attribute
        # reference); on one the devices and the EFA interfaces of a claim share a group id.
        assert group is not None, f"{shape.name}: no connected group of {shape.neuron_devices}"
        devices["constraints"] = [
            {
                "requests": [dra.NEURON_REQUEST, dra.EFA_REQUEST],
                "matchAttribute": dra.device_group_attribute(group),
            }
        ]
    if lnc is not None:
        devices["config"] = [
            {
                "requests": [dra.NEURON_REQUEST],
                "opaque": {
                    "driver": dra.NEURON_DRIVER,
                    "parameters": {
                        "apiVersion": dra.NEURON_CONFIG_API_VERSION,
                        "kind": dra.NEURON_CONFIG_KIND,
                        "logicalNeuronCore": lnc,
                    },
                },
            }
        ]
    return {"devices": devices}


def device_claim_template(job: JobRef) -> Obj:
    shape = INSTANCE_TYPES[job.spec.instance_type.value]
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaimTemplate",
        "metadata": job.metadata(template_name(job)),
        "spec": {"spec": claim_spec(shape, job.spec.effective_lnc)},
    }


def pod_resource_claims(job: JobRef) -> list[Obj]:
    """pod.spec.resourceClaims of a training or compile pod."""
    return [{"name": dra.POD_CLAIM_NAME, "resourceClaimTemplateName": template_name(job)}]


def container_claims() -> list[Obj]:
    """The trainer container's resources.claims: the pod's one claim."""
    return [{"name": dra.POD_CLAIM_NAME}]

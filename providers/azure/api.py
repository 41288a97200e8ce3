"""Azure Resource Manager VM bodies and response parsing for Spot VMs (pure functions, no I/O).

libcloud 3.9.1's Azure ARM driver sends no spot fields and breaks `ex_customdata` (bytes vs
str), so spotrun builds the `virtualMachines/createOrUpdate` body itself: `priority: Spot`,
`evictionPolicy`, `billingProfile.maxPrice` (-1: pay up to on-demand), tags, and cloud-init
custom data as a base64 *str*. Spot prices come from the public Azure Retail Prices API
(https://prices.azure.com/api/retail/prices, no credentials needed).

Tested against recorded, real-shaped JSON only (tests/data/azure/); no Azure provider class that
calls the API exists yet (see the report of issue 6).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from spotrun.providers.base import InstanceState, LaunchSpec

RETAIL_PRICES_URL = "https://prices.azure.com/api/retail/prices"


def vm_body(
    spec: LaunchSpec,
    *,
    index: int,
    image: Mapping[str, str],
    nic_id: str,
    user_data: str,
    host_public_key: str,
    ssh_user: str,
    eviction_policy: str = "Delete",
    max_price: float = -1.0,
) -> dict[str, Any]:
    """The PUT body for VM `index` of `spec` in `spec.offer.region` (and zone, if the offer has
    one): a Spot VM unless `spec.offer.spot` is False; disks and NIC are deleted with the VM."""
    tags = {
        "spotrun": "1",
        "spotrun-cluster": spec.cluster,
        "spotrun-idempotency-key": spec.idempotency_key,
        "spotrun-host-key": host_public_key,
        "spotrun-index": str(index),
        "spotrun-price": f"{spec.offer.price:.6f}",
        "spotrun-on-demand": f"{spec.offer.on_demand_price:.6f}",
        **{f"spotrun-label-{k}": v for k, v in spec.labels.items()},
    }
    properties: dict[str, Any] = {
        "hardwareProfile": {"vmSize": spec.offer.instance_type},
        "storageProfile": {
            "imageReference": dict(image),
            "osDisk": {
                "createOption": "FromImage",
                "deleteOption": "Delete",
                "managedDisk": {"storageAccountType": "Premium_LRS"},
            },
        },
        "osProfile": {
            "computerName": f"{spec.cluster[:50]}-{index}",
            "adminUsername": ssh_user,
            "customData": base64.b64encode(user_data.encode()).decode("ascii"),
            "linuxConfiguration": {
                "disablePasswordAuthentication": True,
                "ssh": {
                    "publicKeys": [
                        {"path": f"/home/{ssh_user}/.ssh/authorized_keys", "keyData": spec.ssh_public_key.strip()}
                    ]
                },
            },
        },
        "networkProfile": {
            "networkInterfaces": [{"id": nic_id, "properties": {"primary": True, "deleteOption": "Delete"}}]
        },
    }
    if spec.offer.spot:
        properties.update(
            {"priority": "Spot", "evictionPolicy": eviction_policy, "billingProfile": {"maxPrice": max_price}}
        )
    body: dict[str, Any] = {"location": spec.offer.region, "tags": tags, "properties": properties}
    if spec.offer.zone and spec.offer.zone != spec.offer.region:
        body["zones"] = [spec.offer.zone.rsplit("-", 1)[-1]]
    return body


def parse_vm(vm: Mapping[str, Any], instance_view: Mapping[str, Any]) -> dict[str, Any]:
    """State and spotrun's tags of a VM from its resource JSON and its `instanceView`.

    A Spot VM deallocated by Azure (eviction policy Deallocate) is PREEMPTED; with policy Delete
    the VM is gone from the list and the caller decides (its Scheduled Events notice says Preempt).
    """
    codes = [s.get("code", "") for s in instance_view.get("statuses", [])]
    power = next((c.split("/", 1)[1] for c in codes if c.startswith("PowerState/")), "")
    provisioning = next((c.split("/", 1)[1] for c in codes if c.startswith("ProvisioningState/")), "")
    spot = vm.get("properties", {}).get("priority") == "Spot"
    if provisioning == "failed":
        state = InstanceState.FAILED
        reason = next(
            (
                s.get("message")
                for s in instance_view.get("statuses", [])
                if s.get("code", "").startswith("ProvisioningState/")
            ),
            None,
        )
    elif power == "running":
        state, reason = InstanceState.RUNNING, None
    elif power in ("starting", "") or provisioning in ("creating", "updating"):
        state, reason = InstanceState.PENDING, None
    elif spot and power == "deallocated" and vm.get("properties", {}).get("evictionPolicy") == "Deallocate":
        state, reason = InstanceState.PREEMPTED, "Spot VM evicted (deallocated by Azure)"
    else:
        state, reason = InstanceState.TERMINATED, f"PowerState/{power}"
    tags = dict(vm.get("tags") or {})
    return {
        "id": vm.get("name", ""),
        "resource_id": vm.get("id", ""),
        "location": vm.get("location", ""),
        "zone": (vm.get("zones") or [""])[0],
        "instance_type": vm.get("properties", {}).get("hardwareProfile", {}).get("vmSize", ""),
        "state": state,
        "reason": reason,
        "cluster": tags.get("spotrun-cluster", ""),
        "idempotency_key": tags.get("spotrun-idempotency-key", ""),
        "host_public_key": tags.get("spotrun-host-key", ""),
        "price": float(tags.get("spotrun-price") or 0.0),
        "on_demand": float(tags.get("spotrun-on-demand") or 0.0),
        "spot": spot,
    }


def retail_prices(page: Mapping[str, Any]) -> dict[tuple[str, str], dict[str, float]]:
    """{(region, vmSize): {"spot": $/h, "on_demand": $/h}} from a Retail Prices API page, Linux
    consumption meters only (Windows and Low Priority meters are skipped)."""
    found: dict[tuple[str, str], dict[str, float]] = {}
    for item in page.get("Items", []):
        if (
            item.get("serviceName") != "Virtual Machines"
            or item.get("type") != "Consumption"
            or item.get("unitOfMeasure") != "1 Hour"
            or "Windows" in item.get("productName", "")
            or "Low Priority" in item.get("meterName", "")
        ):
            continue
        kind = "spot" if item.get("meterName", "").endswith(" Spot") else "on_demand"
        key = (item.get("armRegionName", ""), item.get("armSkuName", ""))
        found.setdefault(key, {})[kind] = float(item.get("retailPrice", 0.0))
    return found


def retail_prices_query(region: str, vm_sizes: list[str]) -> dict[str, str]:
    """The `$filter` query for Linux VM prices of `vm_sizes` in `region` (follow NextPageLink)."""
    sizes = " or ".join(f"armSkuName eq '{s}'" for s in vm_sizes)
    return {"$filter": f"serviceName eq 'Virtual Machines' and armRegionName eq '{region}' and ({sizes})"}

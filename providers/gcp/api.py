"""Compute Engine request bodies and response parsing for Spot VMs (pure functions, no I/O).

libcloud 3.9.1's GCE driver only knows the legacy `scheduling.preemptible`; a Spot VM needs
`scheduling.provisioningModel: SPOT` and `instanceTerminationAction`, so spotrun builds the
`instances.insert` body itself (to be POSTed through libcloud's authenticated GCE connection).
Preemption is read from the zone's operations (`operationType: compute.instances.preempted`),
because a Spot VM with termination action DELETE disappears from `instances.list`.

Prices: libcloud's static per-vCPU/per-GiB rates (family_price) for the CPU families, and the
Cloud Billing Catalog's Compute Engine SKUs (parse_billing_skus, catalog_price) for the GPU
families, whose machine types are priced from their family's core, RAM and GPU SKUs.

Tested against recorded, real-shaped JSON only (tests/data/gcp/); provider.py makes the calls.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from spotrun.providers.base import InstanceState, LaunchSpec
from spotrun.providers.gcp.catalog import MACHINE_TYPES

COMPUTE_SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]


def endpoint_parts(url: str) -> tuple[str, int, bool]:
    """(host, port, secure) of an endpoint URL such as http://127.0.0.1:8080."""
    parts = urlsplit(url)
    secure = parts.scheme != "http"
    return parts.hostname or "", parts.port or (443 if secure else 80), secure


_NOT_LABEL = re.compile(r"[^a-z0-9_-]+")
_NOT_NAME = re.compile(r"[^a-z0-9-]+")
_STATES = {
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "RUNNING": InstanceState.RUNNING,
    "REPAIRING": InstanceState.PENDING,
}
# The Compute Engine service in Google's Cloud Billing Catalog (`services/<id>/skus`).
COMPUTE_SERVICE_ID = "6F81-5844-456A"
_USAGE = {"OnDemand": "on_demand", "Preemptible": "spot"}  # Spot VMs bill the Preemptible SKUs
_SPOT_PREFIX = re.compile(r"^Spot Preemptible\s+")
# "A2 Instance Core running in Americas" / "G2 Instance Ram running in Americas" (not Custom,
# Sole Tenancy, Commitment...; those are other words before "Instance").
_MACHINE_SKU = re.compile(r"^(?P<family>[A-Z][A-Z0-9]*) Instance (?P<part>Core|Ram) running in ")
# "Nvidia Tesla A100 GPU running in Americas", "Nvidia L4 GPU running in Americas"; an
# "A100 80GB" is another GPU than an "A100".
_GPU_SKU = re.compile(
    r"^Nvidia (?:Tesla )?(?P<gpu>[A-Za-z0-9]+(?: \d+GB)?) GPU "
    r"(?:attached to Spot Preemptible VMs )?running in "
)
_UNITS = {"core": "h", "ram": "GiBy.h", "gpu": "h"}


def label(value: str) -> str:
    """A GCE label value: lowercase letters, digits, '_' and '-', at most 63 characters."""
    return _NOT_LABEL.sub("-", value.lower())[:63]


def instance_name(cluster: str, idempotency_key: str, index: int) -> str:
    """Deterministic per (cluster, key, index), so a retried insert hits `alreadyExists`."""
    slug = _NOT_NAME.sub("-", cluster.lower()).strip("-")[:40] or "c"
    digest = hashlib.sha256(f"{cluster}/{idempotency_key}".encode()).hexdigest()[:6]
    return f"sr-{slug}-{digest}-{index}"


def instance_body(
    spec: LaunchSpec,
    *,
    index: int,
    image: str,
    user_data: str,
    host_public_key: str,
    ssh_user: str,
    network: str = "global/networks/default",
    disk_gb: int = 200,
) -> dict[str, Any]:
    """The `instances.insert` body of VM `index` of `spec`: a Spot VM (or standard when
    `spec.offer.spot` is False) deleted on preemption, labelled with the cluster and key, with
    the cluster's SSH key, the cloud-init `user_data` and the host key in its metadata, and the
    network tag `spotrun-<cluster>` that the cluster's firewall rules select."""
    zone = spec.offer.zone
    labels = {
        "spotrun": "1",
        "spotrun-cluster": label(spec.cluster),
        "spotrun-key": label(spec.idempotency_key),
        **{label(k): label(v) for k, v in spec.labels.items()},
    }
    scheduling: dict[str, Any] = {"onHostMaintenance": "TERMINATE", "automaticRestart": not spec.offer.spot}
    if spec.offer.spot:
        scheduling.update({"provisioningModel": "SPOT", "instanceTerminationAction": "DELETE"})
    else:
        scheduling["provisioningModel"] = "STANDARD"
    metadata = {
        "ssh-keys": f"{ssh_user}:{spec.ssh_public_key.strip()}",
        "user-data": user_data,
        "spotrun-cluster": spec.cluster,
        "spotrun-idempotency-key": spec.idempotency_key,
        "spotrun-host-key": host_public_key,
        "spotrun-price": f"{spec.offer.price:.6f}",
        "spotrun-on-demand": f"{spec.offer.on_demand_price:.6f}",
    }
    return {
        "name": instance_name(spec.cluster, spec.idempotency_key, index),
        "machineType": f"zones/{zone}/machineTypes/{spec.offer.instance_type}",
        "labels": labels,
        "tags": {"items": [f"spotrun-{_NOT_NAME.sub('-', spec.cluster.lower()).strip('-')[:50]}"]},
        "metadata": {"items": [{"key": k, "value": v} for k, v in metadata.items()]},
        "scheduling": scheduling,
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "type": "PERSISTENT",
                "initializeParams": {"sourceImage": image, "diskSizeGb": str(disk_gb), "labels": labels},
            }
        ],
        "networkInterfaces": [
            {"network": network, "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}]}
        ],
    }


def preempted(operations: Mapping[str, Any]) -> dict[str, str]:
    """{instance name: status message} from a `zoneOperations.list` response."""
    found = {}
    for op in operations.get("items", []):
        if op.get("operationType") == "compute.instances.preempted":
            name = str(op.get("targetLink", "")).rsplit("/", 1)[-1]
            found[name] = op.get("statusMessage") or "Instance was preempted."
    return found


def parse_instance(item: Mapping[str, Any], preempted_names: Mapping[str, str]) -> dict[str, Any]:
    """The fields spotrun needs from an `instances.get/list` item: id, name, zone, type, state,
    reason, host, labels and spotrun's metadata values."""
    meta = {m["key"]: m.get("value", "") for m in item.get("metadata", {}).get("items", [])}
    status, name = item.get("status", ""), item.get("name", "")
    if status in _STATES:
        state, reason = _STATES[status], None
    elif name in preempted_names:
        state, reason = InstanceState.PREEMPTED, preempted_names[name]
    else:
        state, reason = InstanceState.TERMINATED, item.get("statusMessage") or status.lower() or None
    nic = (item.get("networkInterfaces") or [{}])[0]
    access = (nic.get("accessConfigs") or [{}])[0]
    return {
        "id": name,
        "numeric_id": item.get("id"),
        "zone": str(item.get("zone", "")).rsplit("/", 1)[-1],
        "instance_type": str(item.get("machineType", "")).rsplit("/", 1)[-1],
        "state": state,
        "reason": reason,
        "host": access.get("natIP") or nic.get("networkIP", ""),
        "private_ip": nic.get("networkIP"),
        "labels": dict(item.get("labels", {})),
        "cluster": meta.get("spotrun-cluster", ""),
        "idempotency_key": meta.get("spotrun-idempotency-key", ""),
        "host_public_key": meta.get("spotrun-host-key", ""),
        "price": float(meta.get("spotrun-price") or 0.0),
        "on_demand": float(meta.get("spotrun-on-demand") or 0.0),
        "created": item.get("creationTimestamp"),
        "provisioning_model": item.get("scheduling", {}).get("provisioningModel", "STANDARD"),
    }


def preempted_instance(name: str, zone: str, message: str) -> dict[str, Any]:
    """A deleted Spot VM known only from its preemption operation (termination action DELETE)."""
    return {"id": name, "zone": zone, "state": InstanceState.PREEMPTED, "reason": message}


def family_price(machine_type: str, region: str) -> tuple[float, float] | None:
    """(spot, on-demand) $/h from libcloud's per-vCPU and per-GiB `preemptible` / `on_demand`
    rates for the machine family; None when libcloud has no rates for it (a2, g2: GPU families,
    which need the Cloud Billing Catalog)."""
    from libcloud.pricing import get_pricing

    shape = MACHINE_TYPES.get(machine_type)
    family = (get_pricing("compute", "gce_instances") or {}).get(machine_type.split("-", 1)[0])
    if shape is None or family is None:
        return None
    cpus, ram, _, _ = shape
    prices = []
    for kind in ("preemptible", "on_demand"):
        cpu = family.get("cpu", {}).get(kind, {}).get(region, {}).get("price")
        mem = family.get("ram", {}).get(kind, {}).get(region, {}).get("price", 0.0)
        if not cpu:
            return None
        prices.append(round(cpus * float(cpu) + ram * float(mem), 6))
    return prices[0], prices[1]


def _unit_price(sku: Mapping[str, Any]) -> tuple[str, float]:
    """(usage unit, USD per unit) of a SKU's current price: the last tier of its first pricing."""
    expression = sku["pricingInfo"][0]["pricingExpression"]
    price = expression["tieredRates"][-1]["unitPrice"]
    return str(expression.get("usageUnit", "")), int(price.get("units") or 0) + int(price.get("nanos") or 0) / 1e9


def sku_rate_key(sku: Mapping[str, Any]) -> tuple[str, str] | None:
    """(rate key, "spot" | "on_demand") of a Compute Engine SKU spotrun prices machines from,
    else None. Keys: `<family>/core` and `<family>/ram` (family lowercase: "a2", "g2") and
    `gpu/<name>` ("gpu/A100", "gpu/L4")."""
    category = sku.get("category") or {}
    kind = _USAGE.get(category.get("usageType", ""))
    if category.get("resourceFamily") != "Compute" or kind is None:
        return None
    description = _SPOT_PREFIX.sub("", str(sku.get("description", "")).strip())
    if category.get("resourceGroup") == "GPU":
        found = _GPU_SKU.match(description)
        return (f"gpu/{found['gpu']}", kind) if found else None
    found = _MACHINE_SKU.match(description)
    if found is None:
        return None
    return f"{found['family'].lower()}/{found['part'].lower()}", kind


def parse_billing_skus(
    skus: Any, rates: dict[str, dict[str, dict[str, float]]] | None = None
) -> dict[str, dict[str, dict[str, float]]]:
    """{region: {rate key: {"spot"|"on_demand": USD per hour (core, GPU) or per GiB-hour (RAM)}}}
    from Cloud Billing Catalog SKUs (`skus` of one or more `services.skus.list` pages), added to
    `rates`. Only Compute SKUs with usage type OnDemand or Preemptible, the expected usage unit
    and a description sku_rate_key knows count; the rest, and malformed SKUs, are skipped. When
    two SKUs give the same rate, the first wins."""
    rates = {} if rates is None else rates
    for sku in skus or []:
        try:
            key = sku_rate_key(sku)
            if key is None:
                continue
            unit, price = _unit_price(sku)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue
        part = "gpu" if key[0].startswith("gpu/") else key[0].rsplit("/", 1)[1]
        if unit != _UNITS[part]:
            continue
        for region in sku.get("serviceRegions") or []:
            rates.setdefault(region, {}).setdefault(key[0], {}).setdefault(key[1], price)
    return rates


def catalog_price(
    machine_type: str, region: str, rates: Mapping[str, Mapping[str, Mapping[str, float]]]
) -> tuple[float, float] | None:
    """(spot, on-demand) $/h of `machine_type` in `region` from parse_billing_skus' `rates`:
    vCPUs x core rate + GiB x RAM rate + GPUs x GPU rate of its family; None when a rate is
    missing (an unknown type, a region without the family or GPU)."""
    shape = MACHINE_TYPES.get(machine_type)
    here = rates.get(region)
    if shape is None or here is None:
        return None
    cpus, ram, gpus, gpu_name = shape
    family = machine_type.split("-", 1)[0]
    parts = [(cpus, f"{family}/core"), (ram, f"{family}/ram")] + ([(gpus, f"gpu/{gpu_name}")] if gpus else [])
    prices = []
    for kind in ("spot", "on_demand"):
        total = 0.0
        for count, key in parts:
            rate = here.get(key, {}).get(kind)
            if rate is None:
                return None
            total += count * rate
        prices.append(round(total, 6))
    return prices[0], prices[1]

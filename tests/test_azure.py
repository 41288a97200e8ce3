"""Azure ARM Spot VM bodies and the parsing of recorded, real-shaped ARM and Retail Prices JSON."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from spotrun.providers import InstanceState, LaunchSpec, Offer
from spotrun.providers.azure.api import parse_vm, retail_prices, retail_prices_query, vm_body

DATA = Path(__file__).parent / "data" / "azure"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0eHhYV3Nm1v0dYh3sCq0nB0u2mM8gqf0XoYlL3b1F me@laptop"
IMAGE = {
    "publisher": "Canonical",
    "offer": "0001-com-ubuntu-server-jammy",
    "sku": "22_04-lts-gen2",
    "version": "latest",
}
NIC = "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/azure-v100-1-nic"


def _spec(spot: bool = True, zone: str = "eastus") -> LaunchSpec:
    offer = Offer("azure", "eastus", zone, "Standard_NC6s_v3", 6, 1, "V100", 0.3672, 3.06, spot=spot)
    return LaunchSpec(cluster="azure-v100", offer=offer, count=2, ssh_public_key=KEY, idempotency_key="up-1")


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_spot_vm_body() -> None:
    body = vm_body(
        _spec(),
        index=1,
        image=IMAGE,
        nic_id=NIC,
        user_data="#cloud-config\n{}\n",
        host_public_key="ssh-ed25519 AAAAhost",
        ssh_user="azureuser",
        max_price=1.2,
    )
    props = body["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Delete"
    assert props["billingProfile"] == {"maxPrice": 1.2}
    custom = props["osProfile"]["customData"]
    assert isinstance(custom, str) and base64.b64decode(custom).decode() == "#cloud-config\n{}\n"
    assert props["osProfile"]["linuxConfiguration"]["ssh"]["publicKeys"] == [
        {"path": "/home/azureuser/.ssh/authorized_keys", "keyData": KEY}
    ]
    assert props["hardwareProfile"] == {"vmSize": "Standard_NC6s_v3"}
    assert props["storageProfile"]["osDisk"]["deleteOption"] == "Delete"
    assert props["networkProfile"]["networkInterfaces"][0]["id"] == NIC
    assert body["location"] == "eastus" and "zones" not in body
    assert (
        body["tags"]["spotrun-cluster"] == "azure-v100" and body["tags"]["spotrun-host-key"] == "ssh-ed25519 AAAAhost"
    )
    json.dumps(body)


def test_regular_vm_body_and_zone() -> None:
    body = vm_body(
        _spec(spot=False, zone="eastus-2"),
        index=0,
        image=IMAGE,
        nic_id=NIC,
        user_data="",
        host_public_key="",
        ssh_user="u",
    )
    assert not {"priority", "evictionPolicy", "billingProfile"} & set(body["properties"])
    assert body["zones"] == ["2"]


def test_parse_vm_states() -> None:
    vm = _load("vm_evicted.json")
    evicted = parse_vm(vm, _load("vm_evicted_instance_view.json"))
    assert evicted["state"] is InstanceState.PREEMPTED and evicted["spot"]
    assert evicted["cluster"] == "azure-v100" and evicted["price"] == pytest.approx(0.3672)
    assert evicted["host_public_key"].startswith("ssh-ed25519 ") and evicted["instance_type"] == "Standard_NC6s_v3"
    running = parse_vm(vm, _load("vm_running_instance_view.json"))
    assert running["state"] is InstanceState.RUNNING and running["reason"] is None


def test_retail_prices() -> None:
    prices = retail_prices(_load("retail_prices.json"))
    assert prices == {("eastus", "Standard_NC6s_v3"): {"spot": 0.3672, "on_demand": 3.06}}
    query = retail_prices_query("eastus", ["Standard_NC6s_v3", "Standard_NC12s_v3"])
    assert query["$filter"] == (
        "serviceName eq 'Virtual Machines' and armRegionName eq 'eastus' and "
        "(armSkuName eq 'Standard_NC6s_v3' or armSkuName eq 'Standard_NC12s_v3')"
    )

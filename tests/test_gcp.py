"""GCE Spot VM request bodies and the parsing of recorded, real-shaped Compute API responses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from spotrun.providers import InstanceState, LaunchSpec, Offer
from spotrun.providers.gcp.api import family_price, instance_body, instance_name, parse_instance, preempted

DATA = Path(__file__).parent / "data" / "gcp"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0eHhYV3Nm1v0dYh3sCq0nB0u2mM8gqf0XoYlL3b1F me@laptop"


def _spec(spot: bool = True) -> LaunchSpec:
    offer = Offer("gcp", "us-central1", "us-central1-a", "a2-highgpu-1g", 12, 1, "A100", 1.101, 3.673, spot=spot)
    return LaunchSpec(
        cluster="GCP_a100",
        offer=offer,
        count=2,
        ssh_public_key=KEY,
        idempotency_key="up-0A1B",
        labels={"Role": "worker"},
    )


def test_spot_instance_body() -> None:
    body = instance_body(
        _spec(),
        index=1,
        image="projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts",
        user_data="#cloud-config\n{}\n",
        host_public_key="ssh-ed25519 AAAAhost",
        ssh_user="ubuntu",
    )
    assert body["name"] == instance_name("GCP_a100", "up-0A1B", 1) and body["name"].startswith("sr-gcp-a100-")
    assert body["machineType"] == "zones/us-central1-a/machineTypes/a2-highgpu-1g"
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
    }
    assert "preemptible" not in body["scheduling"]
    assert body["labels"] == {"spotrun": "1", "spotrun-cluster": "gcp_a100", "spotrun-key": "up-0a1b", "role": "worker"}
    meta = {m["key"]: m["value"] for m in body["metadata"]["items"]}
    assert meta["ssh-keys"] == f"ubuntu:{KEY}" and meta["user-data"].startswith("#cloud-config")
    assert meta["spotrun-host-key"] == "ssh-ed25519 AAAAhost" and meta["spotrun-cluster"] == "GCP_a100"
    assert body["tags"] == {"items": ["spotrun-gcp-a100"]}
    assert body["disks"][0]["autoDelete"] is True and body["disks"][0]["initializeParams"]["sourceImage"].endswith(
        "lts"
    )
    assert body["networkInterfaces"][0]["accessConfigs"][0]["type"] == "ONE_TO_ONE_NAT"
    json.dumps(body)  # serialisable as sent


def test_standard_instance_body() -> None:
    body = instance_body(_spec(spot=False), index=0, image="img", user_data="", host_public_key="", ssh_user="u")
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": True,
        "provisioningModel": "STANDARD",
    }


def test_parse_instances_and_preemption() -> None:
    ops = preempted(json.loads((DATA / "zone_operations.json").read_text()))
    assert ops == {"sr-gcp-a100-3f2a1b-1": "Instance was preempted."}
    items = json.loads((DATA / "instances_list.json").read_text())["items"]
    running, stopping = (parse_instance(item, ops) for item in items)
    assert running["state"] is InstanceState.RUNNING and running["host"] == "34.72.10.20"
    assert running["zone"] == "us-central1-a" and running["instance_type"] == "a2-highgpu-1g"
    assert running["cluster"] == "gcp-a100" and running["idempotency_key"] == "up-0a1b2c3d4e5f"
    assert running["host_public_key"].startswith("ssh-ed25519 ") and running["price"] == pytest.approx(1.101)
    assert running["provisioning_model"] == "SPOT"
    assert stopping["state"] is InstanceState.PREEMPTED and stopping["reason"] == "Instance was preempted."


def test_prices_from_libcloud_preemptible_rates() -> None:
    spot, on_demand = family_price("n1-standard-8", "us-central1")
    assert 0 < spot < on_demand
    assert spot == pytest.approx(8 * 0.00698 + 30 * 0.00094, rel=0.2)  # published n1 Spot rates, us-central1
    assert family_price("a2-highgpu-1g", "us-central1") is None  # GPU families: not in libcloud's data

"""The Azure provider end to end over HTTP, against a local server replaying ARM responses.

No Azure Resource Manager runs locally, so `FakeArm` answers on 127.0.0.1 with responses shaped
like the recorded ones in tests/data/azure/ (VM, instance views, Retail Prices page, ARM
errors), keeping what the provider PUT so later reads show it. Nothing in the provider is
bypassed: libcloud performs the client-credentials login against the fake Azure AD endpoint, and
every ARM call must carry the bearer token it got.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("libcloud")

from cloud_replay import ReplayServer, Request, replay_server
from spotrun.providers import InstanceState, LaunchSpec, Offer, get_provider, supports
from spotrun.providers.azure.provider import AzureProvider, resource_group, vm_name

from spotrun.errors import CapacityError, ProviderError

DATA = Path(__file__).parent / "data" / "azure"
SUB = "00000000-0000-0000-0000-000000000000"
TENANT = "11111111-1111-1111-1111-111111111111"
CLIENT, SECRET, TOKEN = "22222222-2222-2222-2222-222222222222", "s3cret", "eyJ0eXAi.test.token"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0eHhYV3Nm1v0dYh3sCq0nB0u2mM8gqf0XoYlL3b1F me@laptop"


def _load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def _arm_error(status: int, code: str, message: str) -> tuple[int, Any]:
    return status, {"error": {"code": code, "message": message}}


class FakeArm:
    """Azure Resource Manager as far as spotrun uses it: resources kept by (lower-cased) id."""

    def __init__(self, server: ReplayServer) -> None:
        self.server = server
        self.resources: dict[str, dict[str, Any]] = {}
        self.views: dict[str, dict[str, Any]] = {}  # vm id -> instance view
        self.reads: dict[str, int] = {}
        self.vm_error: tuple[int, Any] | None = None  # answer to the next VM PUTs
        self.fail_provisioning: str | None = None  # async failure code for new VMs
        self.vm_template = _load("vm_evicted.json")
        self.running_view = _load("vm_running_instance_view.json")
        self.evicted_view = _load("vm_evicted_instance_view.json")
        server.route("POST", rf"/{TENANT}/oauth2/token", self.token)
        server.route("GET", "/api/retail/prices", self.prices)
        for method in ("GET", "PUT", "DELETE"):
            server.route(method, r"/subscriptions/.*", getattr(self, method.lower()))

    def token(self, req: Request) -> tuple[int, Any]:
        form = req.form
        assert form["grant_type"] == "client_credentials" and form["resource"] == "https://management.core.windows.net/"
        if form["client_id"] != CLIENT or form["client_secret"] != SECRET:
            return 401, {
                "error": "invalid_client",
                "error_description": "AADSTS7000215: Invalid client secret provided.\r\nTrace ID: 1",
            }
        return 200, {
            "token_type": "Bearer",
            "expires_in": "3599",
            "expires_on": str(int(time.time()) + 3599),
            "resource": form["resource"],
            "access_token": TOKEN,
        }

    def prices(self, req: Request) -> tuple[int, Any]:
        assert "armRegionName eq 'eastus'" in req.query["$filter"]
        return 200, _load("retail_prices.json")

    def _denied(self, req: Request) -> tuple[int, Any] | None:
        if req.headers.get("authorization") != f"Bearer {TOKEN}":
            return _arm_error(401, "InvalidAuthenticationToken", "The access token is invalid.")
        return None

    def _group_exists(self, path: str) -> bool:
        group = re.match(r"(/subscriptions/[^/]+/resourcegroups/[^/]+)", path.lower())
        return group is None or group.group(1) in self.resources

    def get(self, req: Request) -> tuple[int, Any]:
        if denied := self._denied(req):
            return denied
        path = req.path.lower()
        if path.endswith("/instanceview"):
            vm_id = path[: -len("/instanceview")]
            if vm_id not in self.resources:
                return _arm_error(404, "ResourceNotFound", "not found")
            self.reads[vm_id] = self.reads.get(vm_id, 0) + 1
            if (
                self.reads[vm_id] >= 2
                and self.views[vm_id] is not self.evicted_view
                and "failed" not in json.dumps(self.views[vm_id])
            ):
                self.views[vm_id] = self.running_view  # boots after one poll
            return 200, self.views[vm_id]
        if path in self.resources:
            return 200, self.resources[path]
        parts = path.split("/")
        if len(parts) == 8 and parts[-2].startswith("microsoft."):  # a list of one type in a group
            if not self._group_exists(path):
                return _arm_error(404, "ResourceGroupNotFound", "Resource group could not be found.")
            prefix = path + "/"
            return 200, {
                "value": [
                    r for k, r in self.resources.items() if k.startswith(prefix) and k.count("/") == path.count("/") + 1
                ]
            }
        if len(parts) == 6 and parts[-1] == "virtualmachines":  # every VM of the subscription
            return 200, {"value": [r for k, r in self.resources.items() if "/microsoft.compute/virtualmachines/" in k]}
        return _arm_error(404, "ResourceNotFound", f"The Resource '{req.path}' was not found.")

    def put(self, req: Request) -> tuple[int, Any]:
        if denied := self._denied(req):
            return denied
        path, body = req.path.lower(), req.json
        if "/resourcegroups/" in path and path.count("/") > 4 and not self._group_exists(path):
            return _arm_error(404, "ResourceGroupNotFound", "Resource group could not be found.")
        name = req.path.rsplit("/", 1)[-1]
        resource = {
            **copy.deepcopy(body),
            "id": req.path,
            "name": name,
            "properties": {**body.get("properties", {}), "provisioningState": "Succeeded"},
        }
        if "/publicipaddresses/" in path:
            resource["properties"]["ipAddress"] = f"20.1.2.{len(self.resources)}"
        if "/networkinterfaces/" in path:
            resource["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"] = (
                f"10.42.0.{len(self.resources)}"
            )
        if "/virtualmachines/" in path:
            if self.vm_error:
                return self.vm_error
            if path in self.resources:
                return _arm_error(409, "PropertyChangeNotAllowed", "Changing property 'customData' is not allowed.")
            resource = {
                **copy.deepcopy(self.vm_template),
                **resource,
                "properties": {
                    **resource["properties"],
                    "vmId": f"vm-{len(self.resources)}",
                    "provisioningState": "Creating",
                    "timeCreated": "2024-05-01T17:00:00.1234567+00:00",
                },
            }
            self.views[path] = {"statuses": [{"code": "ProvisioningState/creating", "level": "Info"}]}
            if self.fail_provisioning:
                self.views[path] = {
                    "statuses": [
                        {
                            "code": f"ProvisioningState/failed/{self.fail_provisioning}",
                            "level": "Error",
                            "message": "Allocation failed. We do not have "
                            "sufficient capacity for the requested VM size in this region.",
                        }
                    ]
                }
        self.resources[path] = resource
        return 201, resource

    def delete(self, req: Request) -> tuple[int, Any]:
        if denied := self._denied(req):
            return denied
        path = req.path.lower()
        if path not in self.resources:
            return 204, None
        doomed = [path]
        if "/virtualmachines/" in path:  # deleteOption: Delete on NIC, IP and disk
            doomed += [
                path.replace("microsoft.compute/virtualmachines", "microsoft.network/networkinterfaces") + "-nic",
                path.replace("microsoft.compute/virtualmachines", "microsoft.network/publicipaddresses") + "-ip",
            ]
        else:  # a resource group: everything in it
            doomed += [k for k in self.resources if k.startswith(path + "/")]
        for key in doomed:
            self.resources.pop(key, None)
            self.views.pop(key, None)
        return 202, None

    def evict(self, name: str) -> None:
        """What Azure does to a Spot VM with eviction policy Deallocate."""
        key = next(k for k in self.resources if k.endswith(f"/virtualmachines/{name}"))
        self.views[key] = self.evicted_view


@pytest.fixture
def arm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeArm]:
    for name, value in (
        ("AZURE_TENANT_ID", TENANT),
        ("AZURE_CLIENT_ID", CLIENT),
        ("AZURE_CLIENT_SECRET", SECRET),
        ("AZURE_SUBSCRIPTION_ID", SUB),
        ("SPOTRUN_HOME", str(tmp_path / "home")),
    ):
        monkeypatch.setenv(name, value)
    for name in ("SPOTRUN_AZURE_REGIONS", "SPOTRUN_AZURE_LOGIN_URL", "SPOTRUN_AZURE_PRICES_URL"):
        monkeypatch.delenv(name, raising=False)
    with replay_server() as server:
        monkeypatch.setenv("SPOTRUN_AZURE_ENDPOINT_URL", server.url)
        monkeypatch.setenv("SPOTRUN_AZURE_PRICES_URL", server.url + "/api/retail/prices")
        yield FakeArm(server)


@pytest.fixture
def provider(arm: FakeArm) -> AzureProvider:
    return AzureProvider(region="eastus", poll_s=0.01, launch_timeout=10)


def _spec(cluster: str = "azure-v100", count: int = 2, key: str = "up-1", spot: bool = True) -> LaunchSpec:
    offer = Offer("azure", "eastus", "eastus", "Standard_NC6s_v3", 6, 1, "V100", 0.3672, 3.06, spot=spot)
    return LaunchSpec(
        cluster=cluster, offer=offer, count=count, ssh_public_key=KEY, idempotency_key=key, labels={"role": "worker"}
    )


def _vm_puts(arm: FakeArm) -> list[Request]:
    return arm.server.sent("PUT", r".*/providers/Microsoft\.Compute/virtualMachines/[^/]+")


def test_registered_and_offers_from_retail_prices(provider: AzureProvider, arm: FakeArm) -> None:
    assert supports(get_provider("azure"), "cleanup") and get_provider("azure").notice_protocol == "azure"
    offers = provider.offers()
    spot = [o for o in offers if o.spot]
    assert [(o.instance_type, o.spot_price, o.on_demand_price, o.gpus, o.gpu_name) for o in spot] == [
        ("Standard_NC6s_v3", 0.3672, 3.06, 1, "V100")
    ]
    assert any(not o.spot for o in offers) and 0 <= provider.price_age(spot[0]) < 60
    provider.offers()  # cached: no second price request
    assert len(arm.server.sent("GET", "/api/retail/prices")) == 1
    assert not [r for r in arm.server.requests if r.path.startswith("/subscriptions")], "prices need no login"


def test_missing_credentials_name_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AZURE_CLIENT_SECRET", raising=False)
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    for name in ("AZURE_TENANT_ID", "AZURE_CLIENT_ID"):
        monkeypatch.setenv(name, "x")
    with pytest.raises(ProviderError, match="no Azure credentials found") as info:
        AzureProvider(region="eastus").instances("c")
    assert "AZURE_CLIENT_SECRET, AZURE_SUBSCRIPTION_ID" in str(info.value) and "\n" not in str(info.value)


def test_wrong_secret_is_one_line_naming_the_variables(provider: AzureProvider, monkeypatch) -> None:
    monkeypatch.setenv("AZURE_CLIENT_SECRET", "wrong")
    with pytest.raises(ProviderError, match="AADSTS7000215") as info:
        provider.instances("azure-v100")
    assert "AZURE_CLIENT_SECRET" in str(info.value) and "\n" not in str(info.value)


def test_launch_spot_vms_with_tags_network_and_idempotency(provider: AzureProvider, arm: FakeArm) -> None:
    spec = _spec()
    ids = provider.launch(spec)
    assert ids == [vm_name("azure-v100", "up-1", i) for i in range(2)]
    assert arm.server.unmatched == []
    assert 1 <= len(arm.server.sent("POST", rf"/{TENANT}/oauth2/token")) <= 3  # one login per thread's driver
    assert all(
        r.headers.get("authorization") == f"Bearer {TOKEN}"
        for r in arm.server.requests
        if r.path.startswith("/subscriptions")
    )

    group = arm.server.sent("PUT", rf"/subscriptions/{SUB}/resourcegroups/{resource_group('azure-v100')}")[0]
    assert group.json == {"location": "eastus", "tags": {"spotrun": "1", "spotrun-cluster": "azure-v100"}}
    assert group.query["api-version"] == "2021-04-01"
    nsg = arm.server.sent("PUT", r".*/networkSecurityGroups/spotrun-eastus-nsg")[0].json
    rule = nsg["properties"]["securityRules"][0]["properties"]
    assert (
        rule["destinationPortRange"] == "22"
        and rule["access"] == "Allow"
        and nsg["tags"]["spotrun-cluster"] == "azure-v100"
    )
    vnet = arm.server.sent("PUT", r".*/virtualNetworks/spotrun-eastus-vnet")[0].json
    assert vnet["properties"]["subnets"][0]["properties"]["networkSecurityGroup"]["id"].endswith("spotrun-eastus-nsg")
    nic = arm.server.sent("PUT", rf".*/networkInterfaces/{ids[0]}-nic")[0].json
    assert nic["properties"]["ipConfigurations"][0]["properties"]["publicIPAddress"]["properties"] == {
        "deleteOption": "Delete"
    }

    puts = _vm_puts(arm)
    assert len(puts) == 2 and puts[0].query["api-version"] == "2023-03-01"
    body = next(r.json for r in puts if r.path.endswith(ids[0]))
    props = body["properties"]
    assert props["priority"] == "Spot" and props["evictionPolicy"] == "Deallocate"
    assert props["billingProfile"] == {"maxPrice": -1.0}
    custom = base64.b64decode(props["osProfile"]["customData"]).decode()
    assert custom.startswith("#cloud-config") and props["osProfile"]["computerName"] == ids[0]
    assert json.loads(custom.split("\n", 1)[1])["ssh_keys"]["ed25519_public"] == body["tags"]["spotrun-host-key"]
    assert props["networkProfile"]["networkInterfaces"][0]["id"].endswith(f"{ids[0]}-nic")
    assert body["tags"]["spotrun-idempotency-key"] == "up-1" and body["tags"]["spotrun-label-role"] == "worker"

    found = provider.instances("azure-v100")
    assert sorted(i.id for i in found) == ids
    first = next(i for i in found if i.id == ids[0])
    assert first.state is InstanceState.RUNNING and first.host.startswith("20.1.2.") and first.ssh_user == "azureuser"
    assert first.host_public_key == body["tags"]["spotrun-host-key"] and first.instance_type == "Standard_NC6s_v3"
    assert first.price_per_hour == pytest.approx(0.3672) and first.launched_at > 0
    assert first.labels == {"role": "worker", "cluster": "azure-v100", "idempotency_key": "up-1"}
    assert first.extra["private_ip"].startswith("10.42.0.") and first.extra["spot"]

    assert provider.launch(spec) == ids and len(_vm_puts(arm)) == 2  # same key: nothing new
    assert len(provider.launch(_spec(count=3))) == 3 and len(_vm_puts(arm)) == 3
    assert arm.server.unmatched == []


def test_evicted_vm_is_preempted(provider: AzureProvider, arm: FakeArm) -> None:
    ids = provider.launch(_spec())
    arm.evict(ids[1])
    found = {i.id: i for i in provider.instances("azure-v100")}
    assert found[ids[0]].state is InstanceState.RUNNING
    assert found[ids[1]].state is InstanceState.PREEMPTED and "evicted" in found[ids[1]].reason
    assert provider.instances("no-such-cluster") == []  # its resource group does not exist


@pytest.mark.parametrize(
    "status,code,message",
    [
        (409, "SkuNotAvailable", "The requested size for resource is currently not available in location 'eastus'."),
        (
            409,
            "OperationNotAllowed",
            "Operation could not be completed as it results in exceeding approved "
            "LowPriorityCores quota. Current Limit: 0.",
        ),
        (409, "ZonalAllocationFailed", "Allocation failed. We do not have sufficient capacity in this zone."),
    ],
)
def test_capacity_and_quota_errors(provider: AzureProvider, arm: FakeArm, status: int, code: str, message: str) -> None:
    arm.vm_error = _arm_error(status, code, message)
    with pytest.raises(CapacityError, match=code) as info:
        provider.launch(_spec(count=1))
    assert "\n" not in str(info.value)


def test_other_operation_not_allowed_is_not_capacity(provider: AzureProvider, arm: FakeArm) -> None:
    arm.vm_error = _arm_error(409, "OperationNotAllowed", "The VM size is not allowed for this image.")
    with pytest.raises(ProviderError) as info:
        provider.launch(_spec(count=1))
    assert not isinstance(info.value, CapacityError)


def test_async_allocation_failure_is_capacity(provider: AzureProvider, arm: FakeArm) -> None:
    arm.fail_provisioning = "AllocationFailed"
    with pytest.raises(CapacityError, match="AllocationFailed"):
        provider.launch(_spec(count=1))


def test_terminate_idempotent_and_cleanup_deletes_the_group(provider: AzureProvider, arm: FakeArm) -> None:
    ids = provider.launch(_spec())
    arm.evict(ids[1])
    provider.terminate([ids[1], "sr-unknown-000000-0"])  # an evicted VM can be deleted too
    assert [i.id for i in provider.instances("azure-v100")] == [ids[0]]
    assert not any(k.endswith(f"{ids[1]}-nic") or k.endswith(f"{ids[1]}-ip") for k in arm.resources)
    provider.terminate([ids[1]])
    assert len(arm.server.sent("DELETE", r".*/virtualMachines/.*")) == 1
    provider.cleanup("azure-v100")
    assert arm.resources == {} and provider.instances("azure-v100") == []
    provider.cleanup("azure-v100")
    assert arm.server.unmatched == []

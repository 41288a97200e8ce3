"""Azure Spot VMs through libcloud's Azure ARM connection (VM bodies: api.py).

libcloud 3.9.1's Azure ARM driver gives spotrun the service-principal login and the
authenticated JSON connection (fixed in driver.py); its `create_node` cannot make a Spot
VM (no `priority`, `evictionPolicy`, `billingProfile`), its `ex_customdata` is broken (bytes vs
str) and its API versions predate Spot and `deleteOption`. So spotrun PUTs its own ARM bodies
(azure_api.vm_body, api-version 2023-03-01) through that connection.

What a launch creates, all tagged `spotrun=1` and `spotrun-cluster=<cluster>`:
- the resource group `spotrun-<cluster>` (one per cluster: `down` deletes it, and with it
  everything below, even what a crash left half-made);
- per region, a network security group `spotrun-<region>-nsg` (SSH from `ssh_cidr`; traffic
  between VMs of the cluster's own virtual network is allowed by Azure's default rule) and a
  virtual network `spotrun-<region>-vnet` whose subnet uses it;
- per VM, named deterministically from (cluster, idempotency key, index): a public IP, a NIC
  (both deleted with the VM) and the Spot VM itself, its own ed25519 host key installed by
  cloud-init (custom data, base64 str) and its public half in the `spotrun-host-key` tag.

Spot VMs are created with eviction policy `Deallocate` (configurable): an evicted VM stays,
deallocated, so `instances()` reports it PREEMPTED (azure_api.parse_vm) until `terminate` or
`down` deletes it; only its disk is billed meanwhile. Launch is idempotent: the VMs carrying the
key are listed first, and only missing names are created (a PUT of an existing name would try
to change its custom data, which Azure refuses).

Configuration: credentials from AZURE_TENANT_ID, AZURE_CLIENT_ID, AZURE_CLIENT_SECRET and
AZURE_SUBSCRIPTION_ID (a service principal, as azure-identity's EnvironmentCredential reads
them); regions from `regions=`, $SPOTRUN_AZURE_REGIONS or eastus, westus2, westeurope; endpoint
from `endpoint_url=` or $SPOTRUN_AZURE_ENDPOINT_URL (ARM), `login_url=` or
$SPOTRUN_AZURE_LOGIN_URL (Azure AD; defaults to the ARM endpoint when that is overridden), and
`prices_url=` or $SPOTRUN_AZURE_PRICES_URL (Retail Prices API, public, no credentials).

Tested against a local HTTP server replaying recorded ARM and Retail Prices responses
(tests/test_azure_provider.py), through the real login and HTTP path; never against Azure.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from spotrun.providers.azure import api as azure_api
from spotrun.providers.azure.catalog import VM_SIZES
from spotrun.providers.azure.credentials import service_principal
from spotrun.providers.azure.notices import BASE_URL as METADATA_URL
from spotrun.providers.base import Instance, InstanceState, LaunchSpec, Offer

from spotrun import log
from spotrun.errors import CapacityError, ProviderError

_log = log.get("providers.azure")

COMPUTE_API, NETWORK_API, RESOURCES_API = "2023-03-01", "2023-04-01", "2021-04-01"
DEFAULT_REGIONS = ("eastus", "westus2", "westeurope")
DEFAULT_IMAGE = {
    "publisher": "Canonical",
    "offer": "0001-com-ubuntu-server-jammy",
    "sku": "22_04-lts-gen2",
    "version": "latest",
}
# ARM error codes that mean "no capacity or quota here now" (OperationNotAllowed only for quota).
CAPACITY_CODES = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
        "QuotaExceeded",
        "SpotQuotaExceeded",
        "LowPriorityQuotaExceeded",
    }
)
CREDENTIAL_CODES = frozenset(
    {
        "invalid_client",
        "unauthorized_client",
        "invalid_request",
        "InvalidAuthenticationToken",
        "AuthenticationFailed",
        "AuthorizationFailed",
        "ExpiredAuthenticationToken",
        "InvalidSubscriptionId",
        "SubscriptionNotFound",
    }
)
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def resource_group(cluster: str) -> str:
    """The cluster's resource group (names allow letters, digits, '.', '_', '-')."""
    return f"spotrun-{cluster}".rstrip(".")


def vm_name(cluster: str, idempotency_key: str, index: int) -> str:
    """Deterministic per (cluster, key, index); a valid VM and computer name (<= 52 chars)."""
    slug = _NOT_NAME.sub("-", cluster.lower()).strip("-")[:40] or "c"
    digest = hashlib.sha256(f"{cluster}/{idempotency_key}".encode()).hexdigest()[:6]
    return f"sr-{slug}-{digest}-{index}"


class AzureProvider:
    """Azure Spot VMs; see the module docstring. Cheap to build: no cloud call, no libcloud import."""

    name = "azure"
    notice_protocol = "azure"
    supports_preempt = False
    supports_purge = False
    supports_cleanup = True

    def __init__(
        self,
        region: str | None = None,
        *,
        regions: Sequence[str] | None = None,
        endpoint_url: str | None = None,
        login_url: str | None = None,
        prices_url: str | None = None,
        image: Mapping[str, str] | None = None,
        ssh_user: str = "azureuser",
        ssh_cidr: str = "*",
        eviction_policy: str = "Deallocate",
        max_price: float = -1.0,
        price_ttl_s: float = 3600.0,
        launch_timeout: float = 600.0,
        poll_s: float = 5.0,
    ) -> None:
        env_regions = [r.strip() for r in os.environ.get("SPOTRUN_AZURE_REGIONS", "").split(",") if r.strip()]
        self.regions = list(regions or ([region] if region else env_regions or DEFAULT_REGIONS))
        self.endpoint_url = endpoint_url or os.environ.get("SPOTRUN_AZURE_ENDPOINT_URL") or None
        self.login_url = login_url or os.environ.get("SPOTRUN_AZURE_LOGIN_URL") or self.endpoint_url
        self.prices_url = prices_url or os.environ.get("SPOTRUN_AZURE_PRICES_URL") or azure_api.RETAIL_PRICES_URL
        self.image = dict(image or DEFAULT_IMAGE)
        self.ssh_user, self.ssh_cidr = ssh_user, ssh_cidr
        self.eviction_policy, self.max_price = eviction_policy, max_price
        self.price_ttl_s, self.launch_timeout, self.poll_s = price_ttl_s, launch_timeout, poll_s
        self._local = threading.local()
        self._fetched_at: dict[str, float] = {}

    # -- protocol -----------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        """A spot and an on-demand offer per known VM size and region that the Retail Prices API
        prices (Linux, cached `price_ttl_s`). The price API needs no credentials, but like every
        cloud provider this raises ProviderError without them (so `spotrun prices` lists only
        launchable clouds), and when the price API cannot be reached."""
        service_principal()
        found = []
        for region in self.regions:
            for (where, size), prices in sorted(self._prices(region).items()):
                shape = VM_SIZES.get(size)
                if shape is None or where != region or "spot" not in prices:
                    continue
                cpus, gpus, gpu_name = shape
                for spot in (True, False):
                    found.append(
                        Offer(
                            provider=self.name,
                            region=region,
                            zone=region,
                            instance_type=size,
                            cpus=cpus,
                            gpus=gpus,
                            gpu_name=gpu_name,
                            spot_price=prices["spot"],
                            on_demand_price=prices.get("on_demand", 0.0),
                            spot=spot,
                        )
                    )
        return found

    def price_age(self, offer: Offer) -> float | None:
        """Seconds since the prices of `offer`'s region were fetched (None: never fetched)."""
        fetched = self._fetched_at.get(offer.region)
        return None if fetched is None else max(0.0, time.time() - fetched)

    def launch(self, spec: LaunchSpec) -> list[str]:
        """Create the missing VMs of `spec` (Spot unless `spec.offer.spot` is False) with their
        network; block until each is running (not until SSH answers). Idempotent per
        idempotency key. Raises CapacityError for SKU, allocation and quota errors (also when a
        VM fails to provision for one), ProviderError otherwise."""
        region, group = spec.offer.region, resource_group(spec.cluster)
        tags = {"spotrun": "1", "spotrun-cluster": spec.cluster}
        self._put(f"{self._sub}/resourcegroups/{group}", RESOURCES_API, {"location": region, "tags": tags})
        subnet_id = self._ensure_network(group, region, tags)
        wanted = [vm_name(spec.cluster, spec.idempotency_key, i) for i in range(spec.count)]
        existing = {
            vm.get("name")
            for vm in self._list_vms(group)
            if (vm.get("tags") or {}).get("spotrun-idempotency-key") == spec.idempotency_key
        }
        missing = [i for i, name in enumerate(wanted) if name not in existing]
        if missing:
            with ThreadPoolExecutor(max_workers=min(len(missing), 16)) as pool:
                list(pool.map(lambda i: self._create_vm(spec, i, group, subnet_id, tags), missing))
            self._wait_running(group, [wanted[i] for i in missing])
        return wanted

    def instances(self, cluster: str) -> list[Instance]:
        """Every VM of `cluster` (its resource group), read now, with its power state and IPs.
        An evicted Spot VM is PREEMPTED. Blocking; raises ProviderError."""
        group = resource_group(cluster)
        vms = [vm for vm in self._list_vms(group) if (vm.get("tags") or {}).get("spotrun-cluster") == cluster]
        if not vms:
            return []
        ips = {
            ip.get("name"): ip.get("properties", {}).get("ipAddress", "")
            for ip in self._list(f"{self._rg(group)}/providers/Microsoft.Network/publicIPAddresses", NETWORK_API)
        }
        private = {}
        for nic in self._list(f"{self._rg(group)}/providers/Microsoft.Network/networkInterfaces", NETWORK_API):
            configs = nic.get("properties", {}).get("ipConfigurations") or [{}]
            private[nic.get("name")] = configs[0].get("properties", {}).get("privateIPAddress", "")

        def read(vm: dict[str, Any]) -> Instance:
            view = self._call("GET", f"{vm['id']}/instanceView", COMPUTE_API, ignore_missing=True) or {}
            return self._instance(vm, view, ips.get(f"{vm['name']}-ip") or "", private.get(f"{vm['name']}-nic") or "")

        with ThreadPoolExecutor(max_workers=min(len(vms), 16)) as pool:
            found = list(pool.map(read, vms))
        return sorted(found, key=lambda i: (i.launched_at, i.id))

    def terminate(self, ids: Sequence[str]) -> None:
        """Delete the VMs named `ids` (with their NIC, public IP and disk); blocks until each is
        gone. Unknown or already deleted names are ignored. Raises ProviderError."""
        wanted = set(ids)
        if not wanted:
            return
        found = [
            vm["id"]
            for vm in self._list(f"{self._sub}/providers/Microsoft.Compute/virtualMachines", COMPUTE_API)
            if vm.get("name") in wanted and (vm.get("tags") or {}).get("spotrun") == "1"
        ]

        def delete(resource_id: str) -> None:
            self._delete_and_wait(resource_id, COMPUTE_API)
            _log.info("deleted Azure VM", extra=log.kv(id=resource_id.rsplit("/", 1)[-1]))

        if found:
            with ThreadPoolExecutor(max_workers=min(len(found), 16)) as pool:
                list(pool.map(delete, found))

    # -- optional operations ------------------------------------------------------------------
    def cleanup(self, cluster: str) -> None:
        """Delete the cluster's resource group and everything in it; blocks until it is gone.
        Idempotent. Raises ProviderError if Azure does not finish within `launch_timeout`."""
        self._delete_and_wait(f"{self._sub}/resourcegroups/{resource_group(cluster)}", RESOURCES_API)

    # -- launch internals ---------------------------------------------------------------------
    def _ensure_network(self, group: str, region: str, tags: Mapping[str, str]) -> str:
        network = f"{self._rg(group)}/providers/Microsoft.Network"
        nsg = self._put(
            f"{network}/networkSecurityGroups/spotrun-{region}-nsg",
            NETWORK_API,
            {
                "location": region,
                "tags": dict(tags),
                "properties": {
                    "securityRules": [
                        {
                            "name": "spotrun-ssh",
                            "properties": {
                                "priority": 1000,
                                "direction": "Inbound",
                                "access": "Allow",
                                "protocol": "Tcp",
                                "sourceAddressPrefix": self.ssh_cidr,
                                "sourcePortRange": "*",
                                "destinationAddressPrefix": "*",
                                "destinationPortRange": "22",
                            },
                        }
                    ]
                },
            },
        )
        vnet_path = f"{network}/virtualNetworks/spotrun-{region}-vnet"
        self._put(
            vnet_path,
            NETWORK_API,
            {
                "location": region,
                "tags": dict(tags),
                "properties": {
                    "addressSpace": {"addressPrefixes": ["10.42.0.0/16"]},
                    "subnets": [
                        {
                            "name": "default",
                            "properties": {"addressPrefix": "10.42.0.0/20", "networkSecurityGroup": {"id": nsg["id"]}},
                        }
                    ],
                },
            },
        )
        return f"{vnet_path}/subnets/default"

    def _create_vm(self, spec: LaunchSpec, index: int, group: str, subnet_id: str, tags: Mapping[str, str]) -> None:
        from spotrun.providers.cloud_init import new_host_key, user_data

        name, region = vm_name(spec.cluster, spec.idempotency_key, index), spec.offer.region
        network = f"{self._rg(group)}/providers/Microsoft.Network"
        zones = {"zones": [spec.offer.zone.rsplit("-", 1)[-1]]} if spec.offer.zone not in ("", region) else {}
        ip = self._put(
            f"{network}/publicIPAddresses/{name}-ip",
            NETWORK_API,
            {
                "location": region,
                "tags": dict(tags),
                "sku": {"name": "Standard"},
                **zones,
                "properties": {"publicIPAllocationMethod": "Static"},
            },
        )
        nic = self._put(
            f"{network}/networkInterfaces/{name}-nic",
            NETWORK_API,
            {
                "location": region,
                "tags": dict(tags),
                "properties": {
                    "ipConfigurations": [
                        {
                            "name": "ipconfig1",
                            "properties": {
                                "subnet": {"id": subnet_id},
                                "privateIPAllocationMethod": "Dynamic",
                                "publicIPAddress": {"id": ip["id"], "properties": {"deleteOption": "Delete"}},
                            },
                        }
                    ]
                },
            },
        )
        host_key = new_host_key()
        body = azure_api.vm_body(
            spec,
            index=index,
            image=self.image,
            nic_id=nic["id"],
            host_public_key=host_key.public,
            ssh_user=self.ssh_user,
            eviction_policy=self.eviction_policy,
            max_price=self.max_price,
            user_data=user_data(host_key, spec.ssh_public_key, cluster=spec.cluster, ssh_user=self.ssh_user),
        )
        body["properties"]["osProfile"]["computerName"] = name  # cluster names may hold '_' or '.'
        self._call("PUT", f"{self._rg(group)}/providers/Microsoft.Compute/virtualMachines/{name}", COMPUTE_API, body)
        _log.info("created Azure VM", extra=log.kv(name=name, region=region, size=spec.offer.instance_type))

    def _wait_running(self, group: str, names: list[str]) -> None:
        deadline = time.monotonic() + self.launch_timeout
        pending = set(names)
        while pending:
            for name in sorted(pending):
                path = f"{self._rg(group)}/providers/Microsoft.Compute/virtualMachines/{name}"
                view = self._call("GET", f"{path}/instanceView", COMPUTE_API, ignore_missing=True)
                codes = [s.get("code", "") for s in (view or {}).get("statuses", [])]
                failed = next(
                    (
                        s
                        for s in (view or {}).get("statuses", [])
                        if s.get("code", "").startswith("ProvisioningState/failed")
                    ),
                    None,
                )
                if view is None or failed is not None:
                    code = (failed or {}).get("code", "ProvisioningState/failed/Deleted").split("/")[-1]
                    message = (failed or {}).get("message") or "the VM disappeared while starting"
                    error = CapacityError if _is_capacity(code, message) or view is None else ProviderError
                    raise error(f"Azure VM {name} failed to start: {code}: {message}")
                if "PowerState/running" in codes:
                    pending.discard(name)
            if pending and time.monotonic() > deadline:
                raise ProviderError(
                    f"Azure VMs {', '.join(sorted(pending))} not running after {self.launch_timeout:.0f}s"
                )
            if pending:
                time.sleep(self.poll_s)

    def _instance(self, vm: Mapping[str, Any], view: Mapping[str, Any], host: str, private_ip: str) -> Instance:
        fields = azure_api.parse_vm(vm, view)
        if not view:  # deleted between the list and the read
            fields.update(state=InstanceState.TERMINATED, reason="deleted")
        tags = dict(vm.get("tags") or {})
        created = vm.get("properties", {}).get("timeCreated")
        return Instance(
            id=fields["id"],
            cluster=fields["cluster"],
            provider=self.name,
            zone=fields["zone"] or fields["location"],
            instance_type=fields["instance_type"],
            state=fields["state"],
            reason=fields["reason"],
            host=host or private_ip,
            ssh_port=22,
            ssh_user=self.ssh_user,
            host_public_key=fields["host_public_key"],
            metadata_url=METADATA_URL,
            price_per_hour=fields["price"],
            on_demand_per_hour=fields["on_demand"],
            launched_at=_timestamp(created),
            labels={
                **{k[len("spotrun-label-") :]: v for k, v in tags.items() if k.startswith("spotrun-label-")},
                "cluster": fields["cluster"],
                "idempotency_key": fields["idempotency_key"],
            },
            extra={
                "resource_id": fields["resource_id"],
                "region": fields["location"],
                "private_ip": private_ip,
                "index": tags.get("spotrun-index"),
                "spot": fields["spot"],
                "eviction_policy": vm.get("properties", {}).get("evictionPolicy"),
                "notice_protocol": self.notice_protocol,
            },
        )

    # -- reading ------------------------------------------------------------------------------
    def _list_vms(self, group: str) -> list[dict[str, Any]]:
        return self._list(f"{self._rg(group)}/providers/Microsoft.Compute/virtualMachines", COMPUTE_API)

    def _list(self, path: str, api: str) -> list[dict[str, Any]]:
        """Every item of an ARM list (following nextLink); a missing resource group is empty."""
        items: list[dict[str, Any]] = []
        page = self._call("GET", path, api, ignore_missing=True)
        while page:
            items.extend(page.get("value", []))
            link = page.get("nextLink")
            if not link:
                break
            parts = urllib.parse.urlsplit(link)
            query = dict(urllib.parse.parse_qsl(parts.query))
            page = self._call("GET", parts.path, query.pop("api-version", api), ignore_missing=True, params=query)
        return items

    def _prices(self, region: str) -> dict[tuple[str, str], dict[str, float]]:
        from spotrun.providers.price_cache import cached

        def fetch() -> list[list[Any]]:
            found: dict[tuple[str, str], dict[str, float]] = {}
            url: str | None = (
                f"{self.prices_url}?{urllib.parse.urlencode(azure_api.retail_prices_query(region, sorted(VM_SIZES)))}"
            )
            while url:
                try:
                    with urllib.request.urlopen(url, timeout=30) as answer:
                        page = json.loads(answer.read())
                except (OSError, ValueError) as exc:
                    raise ProviderError(f"cannot read Azure retail prices from {self.prices_url}: {exc}") from exc
                for key, prices in azure_api.retail_prices(page).items():
                    found.setdefault(key, {}).update(prices)
                url = page.get("NextPageLink")
            return [[r, s, p] for (r, s), p in sorted(found.items())]

        where = hashlib.sha256(self.prices_url.encode()).hexdigest()[:8]
        rows, fetched_at = cached(f"azure-{region}-{where}", self.price_ttl_s, fetch)
        self._fetched_at[region] = fetched_at
        return {(r, s): p for r, s, p in rows}

    # -- plumbing -----------------------------------------------------------------------------
    @property
    def _sub(self) -> str:
        return f"/subscriptions/{service_principal()[3]}"

    def _rg(self, group: str) -> str:
        return f"{self._sub}/resourceGroups/{group}"

    def _driver(self) -> Any:
        """This thread's driver (libcloud connections are not thread-safe); logs in on first use."""
        driver = getattr(self._local, "driver", None)
        if driver is None:
            from spotrun.providers.azure.driver import AzureApiError, SpotrunAzureDriver

            tenant, client, secret, subscription = service_principal()
            try:
                driver = SpotrunAzureDriver(
                    tenant, subscription, client, secret, endpoint_url=self.endpoint_url, login_url=self.login_url
                )
            except AzureApiError as exc:
                raise ProviderError(
                    f"Azure AD rejected the service principal {client}: {exc}",
                    hint="check AZURE_TENANT_ID, AZURE_CLIENT_ID and AZURE_CLIENT_SECRET",
                ) from exc
            except Exception as exc:  # transport errors share no base class
                raise ProviderError(
                    f"cannot log in to Azure at {self.login_url or 'login.microsoftonline.com'}: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            self._local.driver = driver
        return driver

    def _call(
        self,
        method: str,
        path: str,
        api: str,
        body: Any = None,
        *,
        ignore_missing: bool = False,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """One ARM call; Azure errors become CapacityError / ProviderError, a 404 with
        `ignore_missing` None."""
        from spotrun.providers.azure.driver import AzureApiError

        driver = self._driver()
        try:
            if params:
                response = driver.connection.request(
                    path, params={"api-version": api, **params}, method=method, data=body
                )
                return response.object or None
            return driver.arm(method, path, api, body)[1]
        except AzureApiError as exc:
            if ignore_missing and exc.status == 404:
                return None
            if _is_capacity(exc.code, exc.message):
                raise CapacityError(
                    f"Azure {method} {path.rsplit('/', 1)[-1]}: {exc.code}: {exc.message[:300]}",
                    hint="try another region or VM size",
                ) from exc
            if exc.code in CREDENTIAL_CODES or exc.status in (401, 403):
                raise ProviderError(
                    f"Azure refused {method} {path.rsplit('/', 1)[-1]}: {exc.code}: {exc.message[:200]}",
                    hint="check the AZURE_* credentials and the principal's role on AZURE_SUBSCRIPTION_ID",
                ) from exc
            raise ProviderError(f"Azure {method} {path} failed: {exc.code}: {exc.message[:300]}") from exc
        except Exception as exc:
            where = self.endpoint_url or "management.azure.com"
            raise ProviderError(
                f"Azure {method} {path} failed: cannot talk to {where}: {type(exc).__name__}: {exc}"
            ) from exc

    def _put(self, path: str, api: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """PUT a resource and wait until its provisioningState is Succeeded (Azure may answer
        201 Creating first). Returns the resource JSON."""
        resource = self._call("PUT", path, api, dict(body)) or {}
        deadline = time.monotonic() + self.launch_timeout
        while resource.get("properties", {}).get("provisioningState", "Succeeded") not in ("Succeeded", "Failed"):
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"Azure resource {path.rsplit('/', 1)[-1]} not ready after {self.launch_timeout:.0f}s"
                )
            time.sleep(self.poll_s)
            resource = self._call("GET", path, api) or {}
        if resource.get("properties", {}).get("provisioningState") == "Failed":
            raise ProviderError(f"Azure resource {path.rsplit('/', 1)[-1]} failed to provision")
        return resource

    def _delete_and_wait(self, path: str, api: str) -> None:
        if self._call("GET", path, api, ignore_missing=True) is None:
            return
        self._call("DELETE", path, api, ignore_missing=True)
        deadline = time.monotonic() + self.launch_timeout
        while self._call("GET", path, api, ignore_missing=True) is not None:
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"Azure resource {path.rsplit('/', 1)[-1]} not deleted after {self.launch_timeout:.0f}s"
                )
            time.sleep(self.poll_s)


def _is_capacity(code: str, message: str) -> bool:
    return code in CAPACITY_CODES or (code == "OperationNotAllowed" and "quota" in message.lower())


def _timestamp(text: str | None) -> float:
    if not text:
        return 0.0
    text = re.sub(r"(\.\d{6})\d+", r"\1", text.replace("Z", "+00:00"))  # Azure writes 7 fraction digits
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return 0.0

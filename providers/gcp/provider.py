"""Google Compute Engine Spot VMs through libcloud's GCE driver (request bodies: api.py).

libcloud 3.9.1's GCE driver gives spotrun what it does well: service-account OAuth2 (a JWT
signed with the key file's RSA key, exchanged for a bearer token), the JSON connection with
Google's error codes, and polling of zone operations. It cannot create a Spot VM (it only knows
the legacy `scheduling.preemptible`), so spotrun POSTs its own `instances.insert` body
(`provisioningModel: SPOT`, `instanceTerminationAction: DELETE`, gcp_api.instance_body) through
the driver's authenticated connection, and reads instances and operations the same way.

What a launch creates, all named or labelled after the cluster so `down` finds everything:
- two firewall rules on the network: `spotrun-<cluster>-ssh` (tcp:22 from `ssh_cidr`) and
  `spotrun-<cluster>-internal` (every protocol, only between VMs with the cluster's network
  tag), both targeting the tag `spotrun-<cluster>` every VM carries;
- one VM per index, named deterministically from (cluster, idempotency key, index)
  (gcp_api.instance_name), labelled `spotrun=1`, `spotrun-cluster`, `spotrun-key`, with its own
  ed25519 host key generated here and installed by cloud-init (public half in its metadata).

Launch is idempotent twice over: VMs carrying the key are listed first, and a retried insert of
the same name answers `alreadyExists`, which counts as success. A Spot VM deleted on preemption
vanishes from `instances.list`; `instances()` still reports it, as PREEMPTED with Google's
message, from the `compute.instances.preempted` operation that names it. (Names are matched by
the cluster's prefix `sr-<slug>-<6 hex>-<n>`; two clusters whose names differ only in case or
punctuation share a slug and would see each other's preempted VMs.)

Configuration: credentials from `credentials_file=` or $GOOGLE_APPLICATION_CREDENTIALS (a
service-account JSON key); project from `project=`, $SPOTRUN_GCP_PROJECT,
$GOOGLE_CLOUD_PROJECT or the key file's `project_id`; zones from `zones=`, $SPOTRUN_GCP_ZONES
(comma-separated) or a default list; image from `image=` or $SPOTRUN_GCP_IMAGE; endpoint from
`endpoint_url=` or $SPOTRUN_GCP_ENDPOINT_URL: both the Compute API and the OAuth2 token
exchange go there (tests, private endpoints). The token (scope cloud-platform) is cached under
$SPOTRUN_HOME/gcp/.

Prices: the CPU families from libcloud's per-vCPU and per-GiB `preemptible` / `on_demand` rates
(gcp_api.family_price, static, no API call). Families libcloud has no rates for (the GPU families
a2 and g2) are priced live from Google's Cloud Billing Catalog: every page of the Compute Engine
service's SKUs (`GET /v1/services/6F81-5844-456A/skus?currencyCode=USD`, following
`nextPageToken`), fetched with the same bearer token through a libcloud connection that shares
the GCE driver's OAuth2 credential (_billing_connection). A type costs vCPUs x its family's
"Instance Core" rate + GiB x "Instance Ram" rate + GPUs x the GPU's rate, Spot from the
Preemptible SKUs (gcp_api.parse_billing_skus, catalog_price). The parsed rates are cached under
$SPOTRUN_HOME/cache/prices/ for `price_ttl_s` (default a day), and `price_age` gives their age
to `spotrun prices`. The endpoint is `billing_endpoint_url=`, $SPOTRUN_GCP_BILLING_ENDPOINT_URL,
else the Compute endpoint override, else https://cloudbilling.googleapis.com (the project needs
the Cloud Billing API enabled). When the catalog cannot be read, offers() logs a warning and
offers the CPU types only; the failure is not cached.

Tested against a local HTTP server replaying recorded Compute API and Billing Catalog responses
(tests/test_gcp_provider.py), through the real OAuth2 and HTTP path; never against GCP itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from spotrun.providers.base import Instance, LaunchSpec, Offer
from spotrun.providers.gcp import api as gcp_api
from spotrun.providers.gcp.api import COMPUTE_SCOPES, endpoint_parts
from spotrun.providers.gcp.catalog import MACHINE_TYPES
from spotrun.providers.gcp.credentials import service_account
from spotrun.providers.gcp.notices import BASE_URL as METADATA_URL

from spotrun import log
from spotrun.errors import CapacityError, ProviderError
from spotrun.paths import spotrun_home

_log = log.get("providers.gcp")

DEFAULT_ZONES = ("us-central1-a", "us-central1-b", "us-central1-f", "us-east4-a", "us-west2-a", "europe-west4-a")
DEFAULT_IMAGE = "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"
# cloud-platform covers the Compute API and the Cloud Billing Catalog (one token for both).
BILLING_ENDPOINT = "https://cloudbilling.googleapis.com"
BILLING_TIMEOUT_S = 60.0
BILLING_MAX_PAGES = 100

# Error codes (operation errors and API error reasons) that mean "no capacity or quota here now".
CAPACITY_CODES = frozenset(
    {
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
        "RESOURCE_POOL_EXHAUSTED",
        "QUOTA_EXCEEDED",
        "quotaExceeded",
        "REGION_QUOTA_EXCEEDED",
        "UNSUPPORTED_OPERATION_SPOT_CAPACITY",
        "RESOURCE_NOT_AVAILABLE",
        "STOCKOUT",
    }
)
EXISTS_CODES = frozenset({"alreadyExists", "RESOURCE_ALREADY_EXISTS"})
_NOT_NAME = re.compile(r"[^a-z0-9-]+")


def network_tag(cluster: str) -> str:
    """The network tag every VM of `cluster` carries (the firewall rules select it)."""
    return f"spotrun-{_NOT_NAME.sub('-', cluster.lower()).strip('-')[:50]}"


def name_pattern(cluster: str) -> re.Pattern[str]:
    """Matches the names gcp_api.instance_name gives VMs of `cluster` (any key, any index)."""
    sample = gcp_api.instance_name(cluster, "k", 0)
    prefix = sample[: -len("-000000-0")]
    return re.compile(rf"^{re.escape(prefix)}-[0-9a-f]{{6}}-\d+$")


class GcpProvider:
    """GCE Spot VMs; see the module docstring. Cheap to build: no cloud call, no libcloud import."""

    name = "gcp"
    notice_protocol = "gcp"
    supports_preempt = False
    supports_purge = False
    supports_cleanup = True

    def __init__(
        self,
        project: str | None = None,
        *,
        zones: Sequence[str] | None = None,
        credentials_file: str | None = None,
        endpoint_url: str | None = None,
        image: str | None = None,
        ssh_user: str = "ubuntu",
        ssh_cidr: str = "0.0.0.0/0",
        network: str = "global/networks/default",
        disk_gb: int = 200,
        launch_timeout: float = 300.0,
        poll_s: float = 2.0,
        billing_endpoint_url: str | None = None,
        price_ttl_s: float = 86400.0,
    ) -> None:
        """`price_ttl_s`: the Billing Catalog's parsed rates are reused for this long."""
        env_zones = [z.strip() for z in os.environ.get("SPOTRUN_GCP_ZONES", "").split(",") if z.strip()]
        self.zones = list(zones or env_zones or DEFAULT_ZONES)
        self.credentials_file = credentials_file
        self._project = project or os.environ.get("SPOTRUN_GCP_PROJECT") or os.environ.get("GOOGLE_CLOUD_PROJECT")
        self.endpoint_url = endpoint_url or os.environ.get("SPOTRUN_GCP_ENDPOINT_URL") or None
        self.billing_endpoint_url = (
            billing_endpoint_url
            or os.environ.get("SPOTRUN_GCP_BILLING_ENDPOINT_URL")
            or self.endpoint_url
            or BILLING_ENDPOINT
        )
        self.price_ttl_s = price_ttl_s
        self._catalog_fetched_at: float | None = None
        self._catalog_priced: set[tuple[str, str]] = set()  # (region, type) priced from the catalog
        self.image = image or os.environ.get("SPOTRUN_GCP_IMAGE") or DEFAULT_IMAGE
        self.ssh_user, self.ssh_cidr, self.network, self.disk_gb = ssh_user, ssh_cidr, network, disk_gb
        self.launch_timeout, self.poll_s = launch_timeout, poll_s
        self._local = threading.local()

    # -- protocol -----------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        """A spot and an on-demand offer per machine type and zone with a price: libcloud's
        static rates, else (GPU families) the Billing Catalog's, read once per `price_ttl_s`.
        Without the catalog (any error: logged as a warning) only the libcloud-priced types are
        offered. Like every cloud provider it raises ProviderError without credentials, so
        `spotrun prices` lists only launchable clouds."""
        service_account(self.credentials_file)
        found: list[Offer] = []
        catalog: dict[str, Any] | None = None
        priced: set[tuple[str, str]] = set()
        for zone in self.zones:
            region = zone.rsplit("-", 1)[0]
            for machine_type, (cpus, _, gpus, gpu_name) in MACHINE_TYPES.items():
                prices = gcp_api.family_price(machine_type, region)
                if prices is None:
                    if catalog is None:
                        catalog = self._catalog_rates() or {}  # {}: failed, not retried in this call
                    prices = gcp_api.catalog_price(machine_type, region, catalog)
                    if prices is None:
                        continue
                    priced.add((region, machine_type))
                for spot in (True, False):
                    found.append(
                        Offer(
                            provider=self.name,
                            region=region,
                            zone=zone,
                            instance_type=machine_type,
                            cpus=cpus,
                            gpus=gpus,
                            gpu_name=gpu_name,
                            spot_price=prices[0],
                            on_demand_price=prices[1],
                            spot=spot,
                        )
                    )
        self._catalog_priced = priced
        return found

    def price_age(self, offer: Offer) -> float | None:
        """Seconds since the Billing Catalog prices of `offer` were fetched; None for types priced
        from libcloud's static rates (and before offers())."""
        if self._catalog_fetched_at is None or (offer.region, offer.instance_type) not in self._catalog_priced:
            return None
        return max(0.0, time.time() - self._catalog_fetched_at)

    def launch(self, spec: LaunchSpec) -> list[str]:
        """Create the missing VMs of `spec` (Spot unless `spec.offer.spot` is False) and the
        cluster's firewall rules; block until every VM is RUNNING (not until SSH answers).
        Idempotent per idempotency key. Raises CapacityError for exhausted zones and quota (also
        when a VM is preempted while starting), ProviderError otherwise."""
        zone = spec.offer.zone
        self._ensure_firewalls(spec.cluster)
        wanted = [gcp_api.instance_name(spec.cluster, spec.idempotency_key, i) for i in range(spec.count)]
        listed = self._list(f"/zones/{zone}/instances", f'labels.spotrun-key = "{gcp_api.label(spec.idempotency_key)}"')
        existing = {
            item["name"]
            for item in listed
            if _meta(item).get("spotrun-idempotency-key") == spec.idempotency_key
            and _meta(item).get("spotrun-cluster") == spec.cluster
        }
        missing = [i for i, name in enumerate(wanted) if name not in existing]
        if missing:
            with ThreadPoolExecutor(max_workers=min(len(missing), 16)) as pool:
                list(pool.map(lambda i: self._insert(spec, i), missing))
            self._wait_running(zone, [wanted[i] for i in missing])
        return wanted

    def instances(self, cluster: str) -> list[Instance]:
        """Every VM of `cluster` in any zone, read now, plus the Spot VMs GCE deleted on
        preemption (PREEMPTED, with Google's message as reason). Blocking; raises ProviderError."""
        items = self._aggregated("instances", f'labels.spotrun-cluster = "{gcp_api.label(cluster)}"')
        preempted_ops = self._aggregated("operations", 'operationType = "compute.instances.preempted"')
        pattern = name_pattern(cluster)
        mine = {
            op_name: op
            for op in preempted_ops
            if pattern.match(op_name := str(op.get("targetLink", "")).rsplit("/", 1)[-1])
        }
        reasons = gcp_api.preempted({"items": list(mine.values())})
        found = [
            self._instance(gcp_api.parse_instance(item, reasons))
            for item in items
            if _meta(item).get("spotrun-cluster") == cluster
        ]
        listed = {i.id for i in found}
        for name, op in mine.items():
            if name not in listed:
                zone = str(op.get("zone", "")).rsplit("/", 1)[-1]
                found.append(
                    self._instance(
                        {
                            **gcp_api.preempted_instance(name, zone, reasons[name]),
                            "cluster": cluster,
                            "created": op.get("insertTime"),
                        }
                    )
                )
        return sorted(found, key=lambda i: (i.launched_at, i.id))

    def terminate(self, ids: Sequence[str]) -> None:
        """Delete the VMs named `ids` (in whatever zone they are); blocks until each delete
        operation is done. Unknown or already deleted names are ignored. Raises ProviderError."""
        wanted = set(ids)
        if not wanted:
            return
        zones = {
            item["name"]: str(item.get("zone", "")).rsplit("/", 1)[-1]
            for item in self._aggregated("instances", 'labels.spotrun = "1"')
            if item.get("name") in wanted
        }

        def delete(name: str) -> None:
            self._call("DELETE", f"/zones/{zones[name]}/instances/{name}", wait=True, ignore_missing=True)
            _log.info("deleted GCE instance", extra=log.kv(name=name, zone=zones[name]))

        if zones:
            with ThreadPoolExecutor(max_workers=min(len(zones), 16)) as pool:
                list(pool.map(delete, sorted(zones)))

    # -- optional operations ------------------------------------------------------------------
    def cleanup(self, cluster: str) -> None:
        """Delete every VM of `cluster` still there, then its firewall rules. Idempotent."""
        self.terminate([i.id for i in self.instances(cluster) if not i.state.is_gone])
        tag = network_tag(cluster)
        for suffix in ("ssh", "internal"):
            self._call("DELETE", f"/global/firewalls/{tag}-{suffix}", wait=True, ignore_missing=True)

    # -- internals ----------------------------------------------------------------------------
    def _catalog_rates(self) -> dict[str, Any] | None:
        """gcp_api.parse_billing_skus' rates of every Billing Catalog page, cached `price_ttl_s`
        per endpoint (price_cache); None, with a warning, when they cannot be read."""
        from spotrun.providers.price_cache import cached

        def fetch() -> dict[str, Any]:
            rates: dict[str, Any] = {}
            params = {"currencyCode": "USD"}
            for _ in range(BILLING_MAX_PAGES):
                page = self._billing_get(params)
                gcp_api.parse_billing_skus(page.get("skus"), rates)
                if not page.get("nextPageToken"):
                    break
                params = {**params, "pageToken": str(page["nextPageToken"])}
            else:
                raise ProviderError(f"the Cloud Billing Catalog has more than {BILLING_MAX_PAGES} pages of SKUs")
            if not rates:
                raise ProviderError("the Cloud Billing Catalog listed no Compute Engine core, RAM or GPU SKUs")
            return rates

        where = hashlib.sha256(self.billing_endpoint_url.encode()).hexdigest()[:8]
        try:
            rates, fetched_at = cached(f"gcp-billing-v1-{where}", self.price_ttl_s, fetch)
        except (ProviderError, OSError) as exc:
            _log.warning(
                "GCP GPU machine types not offered: no Cloud Billing Catalog prices",
                extra=log.kv(error=str(exc).replace("\n", " ")[:300]),
            )
            return None
        self._catalog_fetched_at = fetched_at
        return rates

    def _billing_get(self, params: Mapping[str, str]) -> dict[str, Any]:
        """One page of the Compute Engine SKUs; raises ProviderError."""
        from libcloud.common.google import GoogleBaseError

        path = f"/v1/services/{gcp_api.COMPUTE_SERVICE_ID}/skus"
        connection = getattr(self._local, "billing", None)
        if connection is None:
            connection = _billing_connection(self._driver().connection, self.billing_endpoint_url, BILLING_TIMEOUT_S)
            self._local.billing = connection
        try:
            page = connection.request(path, method="GET", params=dict(params)).object
        except GoogleBaseError as exc:
            raise ProviderError(
                f"Cloud Billing GET {path} failed: {exc.code or exc.http_code}: {_describe(exc)}",
                hint="enable the Cloud Billing API in the project",
            ) from exc
        except Exception as exc:  # transport errors
            raise ProviderError(
                f"Cloud Billing GET {path} failed: cannot talk to {self.billing_endpoint_url}: {_describe(exc)}"
            ) from exc
        if not isinstance(page, dict):
            raise ProviderError(f"Cloud Billing GET {path} answered {type(page).__name__}, not a JSON object")
        return page

    def _ensure_firewalls(self, cluster: str) -> None:
        tag = network_tag(cluster)
        rules = [
            {
                "name": f"{tag}-ssh",
                "network": self.network,
                "direction": "INGRESS",
                "priority": 1000,
                "description": f"spotrun cluster {cluster}: SSH",
                "sourceRanges": [self.ssh_cidr],
                "targetTags": [tag],
                "allowed": [{"IPProtocol": "tcp", "ports": ["22"]}],
            },
            {
                "name": f"{tag}-internal",
                "network": self.network,
                "direction": "INGRESS",
                "priority": 1000,
                "description": f"spotrun cluster {cluster}: etcd, rendezvous, NCCL between members",
                "sourceTags": [tag],
                "targetTags": [tag],
                "allowed": [{"IPProtocol": "tcp"}, {"IPProtocol": "udp"}, {"IPProtocol": "icmp"}],
            },
        ]
        for rule in rules:
            self._call("POST", "/global/firewalls", rule, wait=True, ignore_exists=True)

    def _insert(self, spec: LaunchSpec, index: int) -> None:
        from spotrun.providers.cloud_init import new_host_key, user_data

        host_key = new_host_key()
        body = gcp_api.instance_body(
            spec,
            index=index,
            image=self.image,
            host_public_key=host_key.public,
            ssh_user=self.ssh_user,
            user_data=user_data(host_key, spec.ssh_public_key, cluster=spec.cluster, ssh_user=self.ssh_user),
            network=self.network,
            disk_gb=self.disk_gb,
        )
        self._call("POST", f"/zones/{spec.offer.zone}/instances", body, wait=True, ignore_exists=True)
        _log.info(
            "created GCE instance", extra=log.kv(name=body["name"], zone=spec.offer.zone, type=spec.offer.instance_type)
        )

    def _wait_running(self, zone: str, names: list[str]) -> None:
        deadline = time.monotonic() + self.launch_timeout
        pending = set(names)
        while pending:
            for name in sorted(pending):
                item = self._call("GET", f"/zones/{zone}/instances/{name}", ignore_missing=True)
                status = (item or {}).get("status", "DELETED")
                if status == "RUNNING":
                    pending.discard(name)
                elif status in ("STOPPING", "TERMINATED", "SUSPENDED", "DELETED"):
                    raise CapacityError(
                        f"GCE Spot VM {name} in {zone} stopped while starting ({status})",
                        hint="the zone is short of Spot capacity; try another zone or type",
                    )
            if pending and time.monotonic() > deadline:
                raise ProviderError(
                    f"GCE VMs {', '.join(sorted(pending))} not running after {self.launch_timeout:.0f}s"
                )
            if pending:
                time.sleep(self.poll_s)

    def _instance(self, fields: Mapping[str, Any]) -> Instance:
        created = fields.get("created")
        labels = {
            k: v
            for k, v in dict(fields.get("labels") or {}).items()
            if k not in ("spotrun", "spotrun-cluster", "spotrun-key")
        }
        return Instance(
            id=fields["id"],
            cluster=fields.get("cluster", ""),
            provider=self.name,
            zone=fields.get("zone", ""),
            instance_type=fields.get("instance_type", ""),
            state=fields["state"],
            reason=fields.get("reason"),
            host=fields.get("host", ""),
            ssh_port=22,
            ssh_user=self.ssh_user,
            host_public_key=fields.get("host_public_key", ""),
            metadata_url=METADATA_URL,
            price_per_hour=fields.get("price", 0.0),
            on_demand_per_hour=fields.get("on_demand", 0.0),
            launched_at=datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() if created else 0.0,
            labels={
                **labels,
                "cluster": fields.get("cluster", ""),
                "idempotency_key": fields.get("idempotency_key", ""),
            },
            extra={
                "numeric_id": fields.get("numeric_id"),
                "private_ip": fields.get("private_ip"),
                "provisioning_model": fields.get("provisioning_model"),
                "notice_protocol": self.notice_protocol,
                "project": self.project,
            },
        )

    def _list(self, path: str, filter_: str) -> list[dict[str, Any]]:
        items, params = [], {"filter": filter_}
        while True:
            page = self._call("GET", path, params=params) or {}
            items.extend(page.get("items", []))
            if not page.get("nextPageToken"):
                return items
            params = {**params, "pageToken": page["nextPageToken"]}

    def _aggregated(self, kind: str, filter_: str) -> list[dict[str, Any]]:
        items, params = [], {"filter": filter_}
        while True:
            page = self._call("GET", f"/aggregated/{kind}", params=params) or {}
            for scoped in (page.get("items") or {}).values():
                items.extend(scoped.get(kind, []))
            if not page.get("nextPageToken"):
                return items
            params = {**params, "pageToken": page["nextPageToken"]}

    @property
    def project(self) -> str:
        if not self._project:
            self._project = service_account(self.credentials_file).get("project_id") or None
            if not self._project:
                raise ProviderError("no GCP project set", hint="set SPOTRUN_GCP_PROJECT or GOOGLE_CLOUD_PROJECT")
        return self._project

    def _driver(self) -> Any:
        """This thread's GCE driver (libcloud connections are not thread-safe)."""
        driver = getattr(self._local, "driver", None)
        if driver is None:
            from spotrun.providers.gcp.driver import SpotrunGCEDriver

            account = service_account(self.credentials_file)
            token_dir = spotrun_home() / "gcp"
            # The scopes are part of the name: a token cached for other scopes is not reused.
            where = hashlib.sha256(" ".join([self.endpoint_url or "google", *COMPUTE_SCOPES]).encode()).hexdigest()[:8]
            token_dir.mkdir(parents=True, exist_ok=True)
            try:
                driver = SpotrunGCEDriver(
                    account["client_email"],
                    account["private_key"],
                    project=self.project,
                    endpoint_url=self.endpoint_url,
                    credential_file=str(token_dir / f"token-{self.project}-{where}.json"),
                )
            except Exception as exc:  # libcloud's auth errors share no base class with ours
                raise ProviderError(
                    f"GCP rejected the service-account key of {account['client_email']}: {_describe(exc)}",
                    hint="check GOOGLE_APPLICATION_CREDENTIALS and the account's roles",
                ) from exc
            driver.connection.poll_interval = self.poll_s
            # libcloud infers int from its class default; Connection takes any number of seconds.
            driver.connection.timeout = self.launch_timeout  # type: ignore[assignment]
            self._local.driver = driver
        return driver

    def _call(
        self,
        method: str,
        path: str,
        data: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        wait: bool = False,
        ignore_missing: bool = False,
        ignore_exists: bool = False,
    ) -> Any:
        """One Compute API call (relative to the project); `wait` polls the returned operation
        until DONE. Google errors become CapacityError / ProviderError; a 404 with
        `ignore_missing` and an `alreadyExists` with `ignore_exists` return None."""
        from libcloud.common.google import GoogleBaseError

        driver = self._driver()
        try:
            if wait:
                return driver.connection.async_request(path, method=method, data=data, params=dict(params or {})).object
            return driver.connection.request(path, method=method, data=data, params=dict(params or {})).object
        except GoogleBaseError as exc:
            code = str(exc.code or "")
            if ignore_missing and exc.http_code == 404:
                return None
            if ignore_exists and code in EXISTS_CODES:
                return None
            if code in CAPACITY_CODES:
                raise CapacityError(
                    f"GCE {method} {path}: {code}: {_describe(exc)}", hint="try another zone, machine type or region"
                ) from exc
            if exc.http_code in (401, 403):
                raise ProviderError(
                    f"GCP refused {method} {path}: {_describe(exc)}",
                    hint="check GOOGLE_APPLICATION_CREDENTIALS and the account's Compute roles",
                ) from exc
            raise ProviderError(f"GCE {method} {path} failed: {code or exc.http_code}: {_describe(exc)}") from exc
        except Exception as exc:  # transport errors, operation timeouts
            where = self.endpoint_url or "the Compute Engine API"
            raise ProviderError(f"GCE {method} {path} failed: cannot talk to {where}: {_describe(exc)}") from exc


def _billing_connection(compute: Any, endpoint_url: str, timeout: float) -> Any:
    """A libcloud Google connection to the Cloud Billing API at `endpoint_url` that shares the
    OAuth2 credential of `compute` (a GCE driver's connection): the same bearer token, refreshed
    through the same token exchange, and libcloud's Google error handling (GoogleBaseError).
    Like the driver it belongs to one thread."""
    from libcloud.common.base import ConnectionUserAndKey
    from libcloud.common.google import GoogleBaseConnection

    class BillingConnection(GoogleBaseConnection):
        def __init__(self) -> None:
            host, port, secure = endpoint_parts(endpoint_url)
            # Not GoogleBaseConnection.__init__: it would build a second credential (and token).
            ConnectionUserAndKey.__init__(
                self, compute.user_id, compute.key, secure=secure, host=host, port=port, timeout=timeout
            )
            self.oauth2_credential = compute.oauth2_credential

    return BillingConnection()


def _meta(item: Mapping[str, Any]) -> dict[str, str]:
    return {m["key"]: m.get("value", "") for m in item.get("metadata", {}).get("items", [])}


def _describe(exc: BaseException) -> str:
    value = getattr(exc, "value", None)
    if isinstance(value, dict):
        value = value.get("message") or json.dumps(value)
    return str(value or exc).replace("\n", " ")[:300] or type(exc).__name__

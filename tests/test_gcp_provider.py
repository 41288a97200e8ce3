"""The GCP provider end to end over HTTP, against a local server replaying Compute API responses.

No GCE server exists to run locally, so `FakeCompute` answers on 127.0.0.1 with responses shaped
like the recorded ones in tests/data/gcp/ (instances, operations, errors), keeping the VMs the
provider inserted so later lists show them; `FakeBilling` serves the two recorded pages of the
Cloud Billing Catalog's Compute Engine SKUs (billing_skus_page*.json) on the same server.
Nothing in the provider is bypassed: libcloud signs a real service-account JWT with the test's
RSA key, the server verifies it and hands out a bearer token, and every Compute and Billing call
must carry it.
"""

from __future__ import annotations

import base64
import copy
import itertools
import json
import logging
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("libcloud")

from cloud_replay import ReplayServer, Request, replay_server
from spotrun.providers import InstanceState, LaunchSpec, Offer, get_provider, supports
from spotrun.providers.gcp.api import instance_name
from spotrun.providers.gcp.provider import GcpProvider, network_tag

from spotrun.client.prices import list_prices
from spotrun.errors import CapacityError, ProviderError

DATA = Path(__file__).parent / "data" / "gcp"
PROJECT = "demo-project"
ZONE = "us-central1-a"
BASE = f"/compute/v1/projects/{PROJECT}"
LINK = f"https://www.googleapis.com{BASE}"
CLIENT = "spotrun@demo-project.iam.gserviceaccount.com"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0eHhYV3Nm1v0dYh3sCq0nB0u2mM8gqf0XoYlL3b1F me@laptop"
TOKEN = "ya29.test-token"
SKUS = "/v1/services/6F81-5844-456A/skus"
GPU_TYPES = {"a2-highgpu-1g", "a2-highgpu-8g", "g2-standard-4", "g2-standard-48"}


def _b64json(part: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


class FakeCompute:
    """Compute Engine as far as spotrun uses it, answering with recorded response shapes."""

    def __init__(self, server: ReplayServer, public_key: Any) -> None:
        self.server, self.public_key = server, public_key
        recorded = json.loads((DATA / "instances_list.json").read_text())["items"]
        self.template = recorded[0]
        ops = json.loads((DATA / "zone_operations.json").read_text())["items"]
        self.preempt_template, self.op_template = ops[0], ops[1]
        self.instances: dict[str, dict[str, Any]] = {}  # name -> resource
        self.firewalls: dict[str, dict[str, Any]] = {}
        self.operations: dict[str, dict[str, Any]] = {}
        self.preempted_ops: list[dict[str, Any]] = []
        self.reads: dict[str, int] = {}
        self.insert_error: dict[str, Any] | None = None  # an operation error for the next inserts
        self.insert_http_error: tuple[int, dict[str, Any]] | None = None
        self.tokens_issued = 0
        self._ids = itertools.count(1)
        r = server.route
        r("POST", "/o/oauth2/token", self.token)
        r("GET", rf"{BASE}/zones/([^/]+)/instances", self.list_zone)
        r("POST", rf"{BASE}/zones/([^/]+)/instances", self.insert)
        r("GET", rf"{BASE}/zones/([^/]+)/instances/([^/]+)", self.get)
        r("DELETE", rf"{BASE}/zones/([^/]+)/instances/([^/]+)", self.delete)
        r("GET", rf"{BASE}/(?:zones/[^/]+|global)/operations/([^/]+)", self.operation)
        r("GET", rf"{BASE}/aggregated/instances", self.aggregated_instances)
        r("GET", rf"{BASE}/aggregated/operations", self.aggregated_operations)
        r("POST", rf"{BASE}/global/firewalls", self.insert_firewall)
        r("DELETE", rf"{BASE}/global/firewalls/([^/]+)", self.delete_firewall)

    # -- auth ---------------------------------------------------------------------------------
    def token(self, req: Request) -> tuple[int, Any]:
        from cryptography.hazmat.primitives.asymmetric.padding import PKCS1v15
        from cryptography.hazmat.primitives.hashes import SHA256

        form = req.form
        assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
        header, claims, signature = form["assertion"].split(".")
        self.public_key.verify(
            base64.urlsafe_b64decode(signature + "=" * (-len(signature) % 4)),
            f"{header}.{claims}".encode(),
            PKCS1v15(),
            SHA256(),
        )
        claim = _b64json(claims)
        assert claim["iss"] == CLIENT and claim["scope"] == "https://www.googleapis.com/auth/cloud-platform"
        self.tokens_issued += 1
        return 200, {"access_token": TOKEN, "expires_in": 3599, "token_type": "Bearer"}

    def _authorized(self, req: Request) -> tuple[int, Any] | None:
        if req.headers.get("authorization") != f"Bearer {TOKEN}":
            return 401, {
                "error": {
                    "code": 401,
                    "message": "Request had invalid authentication credentials.",
                    "errors": [{"reason": "authError", "message": "Invalid Credentials"}],
                }
            }
        return None

    # -- operations ---------------------------------------------------------------------------
    def _op(self, kind: str, target: str, zone: str | None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        name = f"operation-{next(self._ids)}"
        scope = f"zones/{zone}" if zone else "global"
        op = {
            **copy.deepcopy(self.op_template),
            "name": name,
            "operationType": kind,
            "status": "RUNNING",
            "targetLink": f"{LINK}/{target}",
            "selfLink": f"{LINK}/{scope}/operations/{name}",
            "progress": 0,
        }
        if zone:
            op["zone"] = f"{LINK}/zones/{zone}"
        else:
            op.pop("zone", None)
        self.operations[name] = {**op, "status": "DONE", "progress": 100, **({"error": error} if error else {})}
        return op

    def operation(self, req: Request) -> tuple[int, Any]:
        return self._authorized(req) or (200, self.operations[req.match.group(1)])

    # -- instances ----------------------------------------------------------------------------
    @staticmethod
    def _matches(item: dict[str, Any], filter_: str) -> bool:
        found = re.fullmatch(r'labels\.([a-z0-9_-]+) = "([^"]*)"', filter_ or "")
        assert found, f"unexpected filter {filter_!r}"
        return item.get("labels", {}).get(found.group(1)) == found.group(2)

    def list_zone(self, req: Request) -> tuple[int, Any]:
        zone = req.match.group(1)
        items = [
            i
            for i in self.instances.values()
            if i["zone"].endswith(f"/{zone}") and self._matches(i, req.query.get("filter", ""))
        ]
        return self._authorized(req) or (
            200,
            {
                "kind": "compute#instanceList",
                "id": f"projects/{PROJECT}/zones/{zone}/instances",
                "items": items,
                "selfLink": f"{LINK}/zones/{zone}/instances",
            },
        )

    def insert(self, req: Request) -> tuple[int, Any]:
        if denied := self._authorized(req):
            return denied
        zone, body = req.match.group(1), req.json
        if self.insert_http_error:
            return self.insert_http_error
        if body["name"] in self.instances:
            return 409, {
                "error": {
                    "code": 409,
                    "message": f"The resource '{body['name']}' already exists",
                    "errors": [
                        {
                            "domain": "global",
                            "reason": "alreadyExists",
                            "message": f"The resource '{body['name']}' already exists",
                        }
                    ],
                }
            }
        if self.insert_error is None:
            item = copy.deepcopy(self.template)
            n = next(self._ids)
            item.update(
                {
                    "id": str(4567890123456700000 + n),
                    "name": body["name"],
                    "status": "STAGING",
                    "zone": f"{LINK}/zones/{zone}",
                    "machineType": f"{LINK}/{body['machineType']}",
                    "labels": body["labels"],
                    "tags": {**body["tags"], "fingerprint": "x="},
                    "metadata": {"kind": "compute#metadata", "fingerprint": "y=", **body["metadata"]},
                    "scheduling": {**body["scheduling"], "preemptible": False},
                    "selfLink": f"{LINK}/zones/{zone}/instances/{body['name']}",
                }
            )
            item["networkInterfaces"][0]["accessConfigs"][0]["natIP"] = f"34.72.11.{n}"
            item["networkInterfaces"][0]["networkIP"] = f"10.128.0.{n}"
            self.instances[body["name"]] = item
        return 200, self._op("insert", f"zones/{zone}/instances/{body['name']}", zone, self.insert_error)

    def get(self, req: Request) -> tuple[int, Any]:
        if denied := self._authorized(req):
            return denied
        name = req.match.group(2)
        item = self.instances.get(name)
        if item is None:
            return 404, {
                "error": {
                    "code": 404,
                    "message": f"The resource '{name}' was not found",
                    "errors": [{"reason": "notFound", "message": "not found"}],
                }
            }
        self.reads[name] = self.reads.get(name, 0) + 1
        if item["status"] == "STAGING" and self.reads[name] >= 2:  # boots after one poll
            item["status"] = "RUNNING"
        return 200, item

    def delete(self, req: Request) -> tuple[int, Any]:
        if denied := self._authorized(req):
            return denied
        zone, name = req.match.groups()
        if self.instances.pop(name, None) is None:
            return 404, {
                "error": {
                    "code": 404,
                    "message": f"The resource '{name}' was not found",
                    "errors": [{"reason": "notFound", "message": "not found"}],
                }
            }
        return 200, self._op("delete", f"zones/{zone}/instances/{name}", zone)

    def preempt(self, name: str) -> None:
        """What GCE does to a Spot VM with termination action DELETE: an operation, then it is gone."""
        item = self.instances.pop(name)
        op = copy.deepcopy(self.preempt_template)
        op.update(
            {
                "targetLink": item["selfLink"],
                "targetId": item["id"],
                "zone": item["zone"],
                "name": f"systemevent-{next(self._ids)}",
            }
        )
        self.preempted_ops.append(op)

    def aggregated_instances(self, req: Request) -> tuple[int, Any]:
        scoped: dict[str, Any] = {}
        for item in self.instances.values():
            if self._matches(item, req.query.get("filter", "")):
                scoped.setdefault("zones/" + item["zone"].rsplit("/", 1)[-1], {"instances": []})["instances"].append(
                    item
                )
        return self._authorized(req) or (200, {"kind": "compute#instanceAggregatedList", "items": scoped})

    def aggregated_operations(self, req: Request) -> tuple[int, Any]:
        assert req.query.get("filter") == 'operationType = "compute.instances.preempted"'
        scoped: dict[str, Any] = {}
        for op in self.preempted_ops:
            scoped.setdefault("zones/" + op["zone"].rsplit("/", 1)[-1], {"operations": []})["operations"].append(op)
        return self._authorized(req) or (200, {"kind": "compute#operationAggregatedList", "items": scoped})

    # -- firewalls ----------------------------------------------------------------------------
    def insert_firewall(self, req: Request) -> tuple[int, Any]:
        if denied := self._authorized(req):
            return denied
        body = req.json
        if body["name"] in self.firewalls:
            return 409, {
                "error": {
                    "code": 409,
                    "message": "already exists",
                    "errors": [{"reason": "alreadyExists", "message": "already exists"}],
                }
            }
        self.firewalls[body["name"]] = body
        return 200, self._op("insert", f"global/firewalls/{body['name']}", None)

    def delete_firewall(self, req: Request) -> tuple[int, Any]:
        name = req.match.group(1)
        if self.firewalls.pop(name, None) is None:
            return 404, {"error": {"code": 404, "message": "not found", "errors": [{"reason": "notFound"}]}}
        return 200, self._op("delete", f"global/firewalls/{name}", None)


class FakeBilling:
    """The Cloud Billing Catalog's `services.skus.list` for Compute Engine: the recorded pages,
    chained by their `nextPageToken`; `failure` answers every request with (status, body)."""

    def __init__(self, server: ReplayServer) -> None:
        self.server = server
        self.pages = [json.loads((DATA / f"billing_skus_page{n}.json").read_text()) for n in (1, 2)]
        self.failure: tuple[int, Any] | None = None
        server.route("GET", SKUS, self.skus)

    def skus(self, req: Request) -> tuple[int, Any]:
        if req.headers.get("authorization") != f"Bearer {TOKEN}":
            return 401, {
                "error": {
                    "code": 401,
                    "message": "Request had invalid authentication credentials.",
                    "status": "UNAUTHENTICATED",
                }
            }
        if self.failure:
            return self.failure
        assert req.query.get("currencyCode") == "USD"
        index = {None: 0, self.pages[0]["nextPageToken"]: 1}[req.query.get("pageToken")]
        return 200, self.pages[index]

    @property
    def requests(self) -> list[Request]:
        return self.server.sent("GET", SKUS)


@pytest.fixture
def gce(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCompute]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    account = tmp_path / "sa.json"
    account.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": PROJECT,
                "private_key_id": "abc",
                "private_key": pem,
                "client_email": CLIENT,
                "client_id": "1",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        )
    )
    for name in ("SPOTRUN_GCP_PROJECT", "GOOGLE_CLOUD_PROJECT", "SPOTRUN_GCP_ZONES", "SPOTRUN_GCP_IMAGE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(account))
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))
    with replay_server() as server:
        monkeypatch.setenv("SPOTRUN_GCP_ENDPOINT_URL", server.url)
        fake = FakeCompute(server, key.public_key())
        fake.billing = FakeBilling(server)  # type: ignore[attr-defined]
        yield fake


@pytest.fixture
def billing(gce: FakeCompute) -> FakeBilling:
    return gce.billing  # type: ignore[attr-defined, no-any-return]


@pytest.fixture
def provider(gce: FakeCompute) -> GcpProvider:
    return GcpProvider(zones=[ZONE], poll_s=0.01, launch_timeout=10)


def _spec(cluster: str = "gcp-a100", count: int = 2, key: str = "up-0a1b2c3d4e5f", spot: bool = True) -> LaunchSpec:
    offer = Offer("gcp", "us-central1", ZONE, "n1-standard-8", 8, 0, None, 0.08, 0.38, spot=spot)
    return LaunchSpec(
        cluster=cluster, offer=offer, count=count, ssh_public_key=KEY, idempotency_key=key, labels={"role": "worker"}
    )


def test_registered_cheap_and_offers_from_libcloud_rates(gce: FakeCompute) -> None:
    provider = get_provider("gcp", zones=["us-central1-a", "us-east4-a"])
    assert provider.name == "gcp" and provider.notice_protocol == "gcp" and supports(provider, "cleanup")
    assert gce.server.requests == [], "building the provider calls nothing"
    offers = provider.offers()
    n1 = [o for o in offers if o.instance_type == "n1-standard-8" and o.spot]
    assert {o.zone for o in n1} == {"us-central1-a", "us-east4-a"}
    assert all(0 < o.spot_price < o.on_demand_price for o in n1) and n1[0].region == "us-central1"
    assert any(not o.spot for o in offers)
    assert provider.price_age(n1[0]) is None, "libcloud's rates are static"
    # Only the token exchange and the Billing Catalog (for the GPU families) were asked.
    assert {r.path for r in gce.server.requests} == {"/o/oauth2/token", SKUS} and gce.server.unmatched == []


# Unit prices of the recorded Billing Catalog SKUs (us-central1 is in their serviceRegions), USD:
# per vCPU-hour (Core), per GiB-hour (Ram), per GPU-hour.
A2_CORE, A2_CORE_SPOT = 0.031611, 0.009483  # "A2 Instance Core", "Spot Preemptible A2 Instance Core"
A2_RAM, A2_RAM_SPOT = 0.004237, 0.001271  # "A2 Instance Ram", "Spot Preemptible A2 Instance Ram"
A100, A100_SPOT = 2.933908, 0.880172  # "Nvidia Tesla A100 GPU" (not the "A100 80GB" at 3.92788)
G2_CORE, G2_CORE_SPOT = 0.024988, 0.009995
G2_RAM, G2_RAM_SPOT = 0.002927, 0.001171
L4, L4_SPOT = 0.560922, 0.224369


def test_gpu_offers_priced_from_the_billing_catalog(
    provider: GcpProvider, gce: FakeCompute, billing: FakeBilling
) -> None:
    provider.zones = [ZONE, "europe-west4-a"]
    offers = provider.offers()
    here = {(o.instance_type, o.spot): o for o in offers if o.zone == ZONE}
    expected = {  # (spot, on-demand) $/h = vCPUs x core + GiB x RAM + GPUs x GPU, by hand
        "a2-highgpu-1g": (
            12 * A2_CORE_SPOT + 85 * A2_RAM_SPOT + 1 * A100_SPOT,  # 1.102003
            12 * A2_CORE + 85 * A2_RAM + 1 * A100,
        ),  # 3.673385
        "a2-highgpu-8g": (
            96 * A2_CORE_SPOT + 680 * A2_RAM_SPOT + 8 * A100_SPOT,  # 8.816024
            96 * A2_CORE + 680 * A2_RAM + 8 * A100,
        ),  # 29.38708
        "g2-standard-4": (
            4 * G2_CORE_SPOT + 16 * G2_RAM_SPOT + 1 * L4_SPOT,  # 0.283085
            4 * G2_CORE + 16 * G2_RAM + 1 * L4,
        ),  # 0.707706
        "g2-standard-48": (
            48 * G2_CORE_SPOT + 192 * G2_RAM_SPOT + 4 * L4_SPOT,  # 1.602068
            48 * G2_CORE + 192 * G2_RAM + 4 * L4,
        ),  # 4.005096
    }
    assert expected["a2-highgpu-1g"][1] == pytest.approx(3.673385)
    assert expected["g2-standard-48"][0] == pytest.approx(1.602068)
    shapes = {
        "a2-highgpu-1g": (12, 1, "A100"),
        "a2-highgpu-8g": (96, 8, "A100"),
        "g2-standard-4": (4, 1, "L4"),
        "g2-standard-48": (48, 4, "L4"),
    }
    for machine_type, (spot_price, on_demand_price) in expected.items():
        for spot in (True, False):
            offer = here[(machine_type, spot)]
            assert offer.spot_price == pytest.approx(spot_price, abs=1e-6), machine_type
            assert offer.on_demand_price == pytest.approx(on_demand_price, abs=1e-6), machine_type
            assert (offer.cpus, offer.gpus, offer.gpu_name) == shapes[machine_type]
            assert offer.region == "us-central1"
            assert offer.price == pytest.approx(spot_price if spot else on_demand_price)
            assert 0 <= provider.price_age(offer) < 60
    # europe-west4 has only an on-demand A2 core and a Spot A100 in the catalog: no GPU offer there,
    # but its CPU offers (libcloud) stay.
    europe = {o.instance_type for o in offers if o.zone == "europe-west4-a"}
    assert europe and not europe & GPU_TYPES
    # `spotrun prices` shows the catalog's age for GCP's GPU rows, none for libcloud's static rows.
    rows = {r.instance_type: r for r in list_prices(providers=[provider]).rows if r.zone == ZONE}
    assert rows["a2-highgpu-1g"].age_s is not None and rows["n1-standard-8"].age_s is None
    assert len(billing.requests) == 2 and gce.server.unmatched == []


def test_billing_catalog_pages_are_followed_with_the_compute_token(
    provider: GcpProvider, gce: FakeCompute, billing: FakeBilling
) -> None:
    assert {o.instance_type for o in provider.offers()} >= GPU_TYPES
    first, second = billing.requests
    assert first.query == {"currencyCode": "USD"}
    assert second.query == {"currencyCode": "USD", "pageToken": billing.pages[0]["nextPageToken"]}
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in (first, second))
    # The GPU and Spot SKUs on page 2 were needed: without it nothing GPU is priced.
    billing.pages[0] = {**billing.pages[0], "nextPageToken": ""}
    fresh = GcpProvider(zones=[ZONE], price_ttl_s=0)
    assert not {o.instance_type for o in fresh.offers()} & GPU_TYPES
    # One token exchange for the Compute API and the catalog of a provider (then the cached token).
    assert gce.tokens_issued == 1
    provider.instances("gcp-a100")
    assert gce.tokens_issued == 1 and gce.server.unmatched == []


def test_failed_billing_catalog_keeps_cpu_offers_and_drops_gpu_types(
    provider: GcpProvider,
    gce: FakeCompute,
    billing: FakeBilling,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.getLogger("spotrun"), "propagate", True)
    billing.failure = (
        403,
        {
            "error": {
                "code": 403,
                "status": "PERMISSION_DENIED",
                "message": f"Cloud Billing API has not been used in project {PROJECT} before or it is disabled.",
                "errors": [
                    {
                        "reason": "accessNotConfigured",
                        "domain": "usageLimits",
                        "message": "Cloud Billing API is disabled.",
                    }
                ],
            }
        },
    )
    with caplog.at_level(logging.WARNING, logger="spotrun.providers.gcp"):
        offers = provider.offers()
    types = {o.instance_type for o in offers}
    assert types == {
        "n1-standard-4",
        "n1-standard-8",
        "n1-standard-16",
        "n2-standard-8",
        "e2-standard-4",
        "c2-standard-8",
    }
    assert not types & GPU_TYPES and all(0 < o.spot_price < o.on_demand_price for o in offers)
    assert all(provider.price_age(o) is None for o in offers)
    warning = [r for r in caplog.records if r.name == "spotrun.providers.gcp" and r.levelno == logging.WARNING]
    # (a handler another test left on the logger may repeat the record: count requests, not records)
    assert warning and all("Cloud Billing API" in r.kv["error"] for r in warning)
    assert len(billing.requests) == 1, "asked once per offers() call"
    # The failure was not cached: the next call reads the catalog again, and prices the GPU types.
    billing.failure = None
    assert {o.instance_type for o in provider.offers()} >= GPU_TYPES

    # An unreachable catalog (its own endpoint, $SPOTRUN_GCP_BILLING_ENDPOINT_URL) is no worse.
    monkeypatch.setenv("SPOTRUN_GCP_BILLING_ENDPOINT_URL", "http://127.0.0.1:9")
    unreachable = GcpProvider(zones=[ZONE], poll_s=0.01)
    assert unreachable.billing_endpoint_url == "http://127.0.0.1:9"
    assert {o.instance_type for o in unreachable.offers()} == types


def test_billing_endpoint_override_goes_to_its_own_server(gce: FakeCompute, monkeypatch: pytest.MonkeyPatch) -> None:
    with replay_server() as other:
        catalog = FakeBilling(other)
        monkeypatch.setenv("SPOTRUN_GCP_BILLING_ENDPOINT_URL", other.url)
        provider = GcpProvider(zones=[ZONE])
        assert {o.instance_type for o in provider.offers()} >= GPU_TYPES
        assert len(catalog.requests) == 2 and other.unmatched == []
        assert gce.billing.requests == [] and gce.tokens_issued == 1  # type: ignore[attr-defined]
    monkeypatch.delenv("SPOTRUN_GCP_BILLING_ENDPOINT_URL")
    assert GcpProvider().billing_endpoint_url == gce.server.url  # defaults to the Compute override
    monkeypatch.delenv("SPOTRUN_GCP_ENDPOINT_URL")
    assert GcpProvider().billing_endpoint_url == "https://cloudbilling.googleapis.com"


def test_billing_catalog_is_cached_within_its_ttl(
    provider: GcpProvider, gce: FakeCompute, billing: FakeBilling, tmp_path: Path
) -> None:
    first = {(o.instance_type, o.spot): o.price for o in provider.offers()}
    assert len(billing.requests) == 2
    # Again, and from another provider (another `spotrun` run): the cached catalog, with its age.
    assert {(o.instance_type, o.spot): o.price for o in provider.offers()} == first
    later = GcpProvider(zones=[ZONE])
    again = later.offers()
    assert {(o.instance_type, o.spot): o.price for o in again} == first
    assert len(billing.requests) == 2, "no catalog request within the TTL"
    entries = list((tmp_path / "home" / "cache" / "prices").glob("gcp-billing-*.json"))
    assert len(entries) == 1
    # An entry older than the TTL is fetched again; its age is what price_age reports.
    entry = json.loads(entries[0].read_text())
    entry["fetched_at"] = time.time() - 3600
    entries[0].write_text(json.dumps(entry))
    hourly = GcpProvider(zones=[ZONE], price_ttl_s=7200)
    a2 = next(o for o in hourly.offers() if o.instance_type == "a2-highgpu-1g")
    assert len(billing.requests) == 2 and 3590 < hourly.price_age(a2) < 3700
    assert {(o.instance_type, o.spot): o.price for o in GcpProvider(zones=[ZONE], price_ttl_s=1800).offers()} == first
    assert len(billing.requests) == 4, "expired: both pages read again"


def test_missing_or_bad_credentials_are_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    with pytest.raises(ProviderError, match="no GCP credentials found") as info:
        GcpProvider(project="p", zones=[ZONE]).instances("c")
    with pytest.raises(ProviderError, match="no GCP credentials found"):
        GcpProvider(project="p", zones=[ZONE]).offers()  # `spotrun prices` skips it with a note
    assert "GOOGLE_APPLICATION_CREDENTIALS" in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "user.json").write_text(json.dumps({"type": "authorized_user", "client_id": "x"}))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "user.json"))
    with pytest.raises(ProviderError, match="not a service-account key"):
        GcpProvider(project="p", zones=[ZONE]).instances("c")


def test_launch_spot_vms_with_labels_firewalls_and_idempotency(provider: GcpProvider, gce: FakeCompute) -> None:
    spec = _spec()
    ids = provider.launch(spec)
    assert ids == [instance_name("gcp-a100", spec.idempotency_key, i) for i in range(2)]
    assert gce.tokens_issued == 1, "a real JWT-bearer token exchange happened once (then cached)"
    assert gce.server.unmatched == []

    inserts = gce.server.sent("POST", rf"{BASE}/zones/{ZONE}/instances")
    assert len(inserts) == 2
    body = next(r.json for r in inserts if r.json["name"] == ids[0])
    assert body["scheduling"] == {
        "onHostMaintenance": "TERMINATE",
        "automaticRestart": False,
        "provisioningModel": "SPOT",
        "instanceTerminationAction": "DELETE",
    }
    assert body["labels"] == {
        "spotrun": "1",
        "spotrun-cluster": "gcp-a100",
        "spotrun-key": "up-0a1b2c3d4e5f",
        "role": "worker",
    }
    assert body["disks"][0]["initializeParams"]["labels"] == body["labels"]
    assert body["machineType"] == f"zones/{ZONE}/machineTypes/n1-standard-8"
    meta = {m["key"]: m["value"] for m in body["metadata"]["items"]}
    assert meta["ssh-keys"] == f"ubuntu:{KEY}" and meta["user-data"].startswith("#cloud-config")
    assert json.loads(meta["user-data"].split("\n", 1)[1])["ssh_keys"]["ed25519_public"] == meta["spotrun-host-key"]
    assert body["tags"]["items"] == [network_tag("gcp-a100")]

    rules = {r.json["name"]: r.json for r in gce.server.sent("POST", rf"{BASE}/global/firewalls")}
    tag = network_tag("gcp-a100")
    assert rules[f"{tag}-ssh"]["allowed"] == [{"IPProtocol": "tcp", "ports": ["22"]}]
    assert rules[f"{tag}-ssh"]["targetTags"] == [tag] and rules[f"{tag}-ssh"]["sourceRanges"] == ["0.0.0.0/0"]
    assert rules[f"{tag}-internal"]["sourceTags"] == [tag] and "sourceRanges" not in rules[f"{tag}-internal"]

    found = provider.instances("gcp-a100")
    assert [i.id for i in found] == ids
    first = found[0]
    assert first.state is InstanceState.RUNNING and first.host.startswith("34.72.11.") and first.ssh_port == 22
    assert first.host_public_key == meta["spotrun-host-key"] and first.zone == ZONE
    assert first.instance_type == "n1-standard-8" and first.price_per_hour == pytest.approx(0.08)
    assert first.labels == {"role": "worker", "cluster": "gcp-a100", "idempotency_key": "up-0a1b2c3d4e5f"}
    assert first.extra["provisioning_model"] == "SPOT" and first.metadata_url == "http://metadata.google.internal"

    # Same key again: nothing new is inserted; a larger count adds only the difference.
    assert provider.launch(spec) == ids and len(gce.server.sent("POST", rf"{BASE}/zones/{ZONE}/instances")) == 2
    assert len(provider.launch(_spec(count=3))) == 3
    assert len(gce.server.sent("POST", rf"{BASE}/zones/{ZONE}/instances")) == 3
    # Every Compute call carried the bearer token from the exchange.
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in gce.server.requests if r.path.startswith(BASE))


def test_insert_race_already_exists_counts_as_success(provider: GcpProvider, gce: FakeCompute) -> None:
    spec = _spec(count=1)
    name = instance_name(spec.cluster, spec.idempotency_key, 0)
    provider.launch(spec)
    gce.instances[name]["labels"]["spotrun-key"] = "hidden-from-the-list"  # the list misses it, the insert hits it
    assert provider.launch(spec) == [name]
    assert gce.server.unmatched == []


def test_preempted_spot_vm_is_reported_after_gce_deleted_it(provider: GcpProvider, gce: FakeCompute) -> None:
    ids = provider.launch(_spec())
    provider.launch(_spec(cluster="gcp-a100-other", count=1, key="k2"))
    gce.preempt(ids[1])
    found = {i.id: i for i in provider.instances("gcp-a100")}
    assert set(found) == set(ids)
    assert found[ids[0]].state is InstanceState.RUNNING
    gone = found[ids[1]]
    assert gone.state is InstanceState.PREEMPTED and gone.reason == "Instance was preempted." and gone.zone == ZONE
    assert gone.state.is_gone and gone.launched_at > 0
    # The other cluster's VMs are not this cluster's, and do not see its preemption.
    other = provider.instances("gcp-a100-other")
    assert [i.state for i in other] == [InstanceState.RUNNING]


def test_recorded_instance_list_through_the_provider(provider: GcpProvider, gce: FakeCompute) -> None:
    recorded = json.loads((DATA / "instances_list.json").read_text())["items"]
    gce.instances = {item["name"]: item for item in recorded}
    gce.preempted_ops = [json.loads((DATA / "zone_operations.json").read_text())["items"][0]]
    running, stopping = provider.instances("gcp-a100")
    assert running.state is InstanceState.RUNNING and running.host == "34.72.10.20"
    assert running.price_per_hour == pytest.approx(1.101) and running.on_demand_per_hour == pytest.approx(3.673)
    assert stopping.state is InstanceState.PREEMPTED and stopping.reason == "Instance was preempted."


def test_capacity_and_quota_errors_become_capacity_error(provider: GcpProvider, gce: FakeCompute) -> None:
    gce.insert_error = {
        "errors": [
            {
                "code": "ZONE_RESOURCE_POOL_EXHAUSTED",
                "message": f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough "
                "resources available to fulfill the request.",
            }
        ]
    }
    with pytest.raises(CapacityError, match="ZONE_RESOURCE_POOL_EXHAUSTED") as info:
        provider.launch(_spec(count=1))
    assert "\n" not in str(info.value)
    gce.insert_error = None
    gce.insert_http_error = (
        403,
        {
            "error": {
                "code": 403,
                "message": "Quota 'PREEMPTIBLE_CPUS' exceeded. Limit: 8.0",
                "errors": [
                    {
                        "domain": "usageLimits",
                        "reason": "quotaExceeded",
                        "message": "Quota 'PREEMPTIBLE_CPUS' exceeded.",
                    }
                ],
            }
        },
    )
    with pytest.raises(CapacityError, match="quotaExceeded"):
        provider.launch(_spec(count=1, key="k2"))


def test_preempted_while_starting_is_capacity(provider: GcpProvider, gce: FakeCompute) -> None:
    original = gce.get

    def vanish(req: Request) -> tuple[int, Any]:
        gce.instances.pop(req.match.group(2), None)
        return original(req)

    gce.server.route("GET", rf"{BASE}/zones/([^/]+)/instances/([^/]+)", vanish)
    with pytest.raises(CapacityError, match="stopped while starting"):
        provider.launch(_spec(count=1))


def test_terminate_is_idempotent_and_cleanup_removes_everything(provider: GcpProvider, gce: FakeCompute) -> None:
    ids = provider.launch(_spec())
    provider.terminate([ids[0], "sr-unknown-000000-0"])
    assert [i.id for i in provider.instances("gcp-a100")] == [ids[1]]
    provider.terminate([ids[0]])  # already gone: nothing sent
    assert len(gce.server.sent("DELETE", rf"{BASE}/zones/{ZONE}/instances/.*")) == 1
    provider.cleanup("gcp-a100")
    assert provider.instances("gcp-a100") == [] and gce.firewalls == {}
    provider.cleanup("gcp-a100")  # twice is fine
    assert gce.server.unmatched == []


def test_wrong_token_is_a_provider_error_naming_credentials(provider: GcpProvider, gce: FakeCompute) -> None:
    gce.server.route(
        "POST",
        "/o/oauth2/token",
        lambda req: (400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."}),
    )
    with pytest.raises(ProviderError, match="GOOGLE_APPLICATION_CREDENTIALS") as info:
        provider.instances("gcp-a100")
    assert "\n" not in str(info.value)

"""AWS EC2 spot VMs through libcloud (see driver.py for the fixes libcloud needs).

What a launch creates, all tagged `spotrun=1` and `spotrun-cluster=<cluster>` so `cleanup` and
crash recovery find everything:
- a key pair `spotrun-<cluster>-<hash of the public key>` holding spotrun's cluster SSH key;
- a security group `spotrun-<cluster>` in the region's default VPC: SSH (port 22) from
  `ssh_cidr`, and every protocol and port (etcd, torch rendezvous, NCCL) only from members of
  the group itself;
- one spot instance per VM (`RunInstances` with `InstanceMarketOptions`, tags given in the same
  call, so no VM ever runs untagged), each with its own ed25519 host key generated here and
  installed by cloud-init (its public half is the `spotrun:host-key` tag: SSH can pin it).

Launches are idempotent per idempotency key twice over: tagged instances are looked up first,
and each RunInstances carries a ClientToken derived from (key, index), so EC2 itself returns the
same instance when a retried call races a lost response.

Configuration (all optional; `get_provider("aws")` works without any): credentials from
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN or ~/.aws/credentials (profile
$AWS_PROFILE, else default); regions from `regions=`, $SPOTRUN_AWS_REGIONS (comma-separated),
$AWS_REGION / $AWS_DEFAULT_REGION, else us-east-1, us-east-2, us-west-2; endpoint from
`endpoint_url=` or $SPOTRUN_AWS_ENDPOINT_URL (moto, private clouds); image from `image=` or
$SPOTRUN_AWS_IMAGE, else the newest AWS Deep Learning Base GPU AMI (Ubuntu 22.04); login user
from `ssh_user=` or $SPOTRUN_AWS_SSH_USER, else ubuntu (the image's user; ec2-user on Amazon Linux).

Tested against moto's EC2 server (tests/test_aws.py), never against AWS itself.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import Element

from spotrun.providers.aws.catalog import CATALOG, InstanceShape, on_demand_price
from spotrun.providers.aws.credentials import keys
from spotrun.providers.aws.notices import BASE_URL as METADATA_URL
from spotrun.providers.base import Instance, InstanceState, LaunchSpec, Offer

from spotrun import log
from spotrun.errors import CapacityError, ProviderError
from spotrun.paths import spotrun_home

_log = log.get("providers.aws")

DEFAULT_REGIONS = ("us-east-1", "us-east-2", "us-west-2")
DEFAULT_IMAGE_NAME = "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"
TAG_SPOTRUN, TAG_CLUSTER, TAG_KEY = "spotrun", "spotrun-cluster", "spotrun:idempotency-key"
TAG_HOST_KEY, TAG_PRICE, TAG_ON_DEMAND = "spotrun:host-key", "spotrun:price", "spotrun:on-demand"
TAG_INDEX = "spotrun:index"
LABEL_PREFIX = "spotrun-label:"
# Error codes that mean "no capacity or quota here now": the controller tries the next candidate.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "VcpuLimitExceeded",
        "InstanceLimitExceeded",
        "Unsupported",
        "InsufficientFreeAddressesInSubnet",
    }
)
CREDENTIAL_CODES = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "UnauthorizedOperation",
        "OptInRequired",
        "ExpiredToken",
        "RequestExpired",
        "InvalidAccessKeyId",
    }
)
SPOT_REASONS = frozenset({"Server.SpotInstanceTermination", "Server.SpotInstanceShutdown"})
FAILED_REASONS = frozenset(
    {
        "Server.InternalError",
        "Server.InsufficientInstanceCapacity",
        "Client.VolumeLimitExceeded",
        "Client.InternalError",
        "Client.InvalidSnapshot.NotFound",
    }
)
_STATES = {"pending": InstanceState.PENDING, "running": InstanceState.RUNNING}


class AwsProvider:
    """EC2 spot VMs; see the module docstring. Cheap to build: no cloud call, no libcloud import."""

    name = "aws"
    notice_protocol = "aws"
    supports_preempt = False
    supports_purge = False
    supports_cleanup = True

    def __init__(
        self,
        region: str | None = None,
        *,
        regions: Sequence[str] | None = None,
        endpoint_url: str | None = None,
        image: str | None = None,
        ssh_user: str | None = None,
        ssh_cidr: str = "0.0.0.0/0",
        instance_types: Mapping[str, InstanceShape] | None = None,
        price_ttl_s: float = 300.0,
        launch_timeout: float = 300.0,
        poll_s: float = 2.0,
    ) -> None:
        """`region` or `regions`: where offers and VMs are looked for (first one is the default).
        `ssh_cidr`: who may reach port 22. `price_ttl_s`: spot prices are reused for this long."""
        env_regions = [r.strip() for r in os.environ.get("SPOTRUN_AWS_REGIONS", "").split(",") if r.strip()]
        default = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        self.regions = list(
            regions or ([region] if region else env_regions or ([default] if default else DEFAULT_REGIONS))
        )
        self.endpoint_url = endpoint_url or os.environ.get("SPOTRUN_AWS_ENDPOINT_URL") or None
        self.image = image or os.environ.get("SPOTRUN_AWS_IMAGE") or None
        self.ssh_user = ssh_user or os.environ.get("SPOTRUN_AWS_SSH_USER") or "ubuntu"
        self.ssh_cidr = ssh_cidr
        self.catalog = dict(instance_types or CATALOG)
        self.price_ttl_s, self.launch_timeout, self.poll_s = price_ttl_s, launch_timeout, poll_s
        self._local = threading.local()
        self._fetched_at: dict[str, float] = {}
        self._images: dict[str, str] = {}

    # -- protocol -----------------------------------------------------------------------------
    def offers(self) -> list[Offer]:
        """A spot and an on-demand offer per catalog type and zone where EC2 reports a spot price.
        Spot prices are live per zone (cached `price_ttl_s`). Blocking; raises ProviderError."""
        found = []
        for region in self.regions:
            for row in self._spot_prices(region):
                shape = self.catalog.get(row["instance_type"])
                if shape is None:
                    continue
                on_demand = on_demand_price(row["instance_type"], region, shape)
                for spot in (True, False):
                    found.append(
                        Offer(
                            provider=self.name,
                            region=region,
                            zone=row["zone"],
                            instance_type=row["instance_type"],
                            cpus=shape.cpus,
                            gpus=shape.gpus,
                            gpu_name=shape.gpu_name,
                            spot_price=row["price"],
                            on_demand_price=on_demand,
                            spot=spot,
                        )
                    )
        return found

    def price_age(self, offer: Offer) -> float | None:
        """Seconds since the spot price of `offer`'s region was fetched (None: never fetched)."""
        fetched = self._fetched_at.get(offer.region)
        return None if fetched is None else max(0.0, time.time() - fetched)

    def launch(self, spec: LaunchSpec) -> list[str]:
        """Launch the missing VMs of `spec` (spot unless `spec.offer.spot` is False), tagged at
        creation; blocks until each is running (not until SSH answers: bootstrap retries that).
        Idempotent per idempotency key. Raises CapacityError for capacity and quota errors (also
        when a VM dies at once for lack of capacity), ProviderError otherwise."""
        region, zone = spec.offer.region, spec.offer.zone
        self._remember_region(spec.cluster, region)
        key_name = self._ensure_key_pair(region, spec.cluster, spec.ssh_public_key)
        group_id = self._ensure_security_group(region, spec.cluster)
        tagged = self._describe(
            region, {f"tag:{TAG_CLUSTER}": [spec.cluster], f"tag:{TAG_KEY}": [spec.idempotency_key]}
        )
        existing = [i.id for i in sorted(tagged, key=lambda i: (int(i.extra.get("index") or 0), i.id))]
        indexes = range(len(existing), spec.count)
        if not indexes:
            return existing
        image = self._image(region)

        def run(index: int) -> str:
            return self._run_one(spec, index, region, zone, image, key_name, group_id)

        with ThreadPoolExecutor(max_workers=min(len(indexes), 16)) as pool:
            new = list(pool.map(run, indexes))
        self._wait_running(region, new)
        return existing + new

    def instances(self, cluster: str) -> list[Instance]:
        """Every instance tagged with `cluster`, in every region it may use, read now. Blocking."""
        found = [
            inst
            for region in self._regions_of(cluster)
            for inst in self._describe(region, {f"tag:{TAG_CLUSTER}": [cluster]})
        ]
        return sorted(found, key=lambda i: (i.launched_at, i.id))

    def terminate(self, ids: Sequence[str]) -> None:
        """TerminateInstances for the ids found in any known region; blocks until each is
        terminated (or `launch_timeout` passes: ProviderError). Unknown ids are ignored."""
        wanted = set(ids)
        if not wanted:
            return
        for region in self._all_known_regions():
            alive = [i.id for i in self._describe(region, {"instance-id": sorted(wanted)}) if not i.state.is_gone]
            if alive:
                self._call(region, "TerminateInstances", _numbered("InstanceId", alive))
                self._wait_gone(region, alive)
                _log.info("terminated EC2 instances", extra=log.kv(region=region, ids=",".join(alive)))

    # -- optional operations ------------------------------------------------------------------
    def cleanup(self, cluster: str) -> None:
        """What `down` needs after the VMs: terminate any instance of `cluster` still alive, then
        delete its security groups and key pairs in every region it used. Idempotent; blocking.
        Raises ProviderError if a group stays in use past `launch_timeout`."""
        self.terminate([i.id for i in self.instances(cluster) if not i.state.is_gone])
        for region in self._regions_of(cluster):
            tagged = _filters({f"tag:{TAG_CLUSTER}": [cluster]})
            for group in self._call(region, "DescribeSecurityGroups", tagged).iterfind("securityGroupInfo/item"):
                self._delete_group(region, group.findtext("groupId") or "")
            for key in self._call(region, "DescribeKeyPairs", tagged).iterfind("keySet/item"):
                self._call(region, "DeleteKeyPair", {"KeyName": key.findtext("keyName") or ""})
        self._forget_cluster(cluster)

    # -- launch internals ---------------------------------------------------------------------
    def _run_one(
        self, spec: LaunchSpec, index: int, region: str, zone: str, image: str, key_name: str, group_id: str
    ) -> str:
        from spotrun.providers.cloud_init import new_host_key, user_data

        host_key = new_host_key()
        tags = {
            TAG_SPOTRUN: "1",
            TAG_CLUSTER: spec.cluster,
            TAG_KEY: spec.idempotency_key,
            TAG_HOST_KEY: host_key.public,
            TAG_PRICE: f"{spec.offer.price:.6f}",
            TAG_ON_DEMAND: f"{spec.offer.on_demand_price:.6f}",
            TAG_INDEX: str(index),
            "Name": f"{spec.cluster}-{index}",
            **{LABEL_PREFIX + k: v for k, v in spec.labels.items()},
        }
        params = {
            "ImageId": image,
            "InstanceType": spec.offer.instance_type,
            "MinCount": "1",
            "MaxCount": "1",
            "KeyName": key_name,
            "SecurityGroupId.1": group_id,
            "Placement.AvailabilityZone": zone,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "ClientToken": hashlib.sha256(f"{spec.cluster}/{spec.idempotency_key}/{index}".encode()).hexdigest()[:64],
            "UserData": base64.b64encode(
                user_data(host_key, spec.ssh_public_key, cluster=spec.cluster, ssh_user=self.ssh_user).encode()
            ).decode(),
        }
        if spec.offer.spot:
            params.update(
                {
                    "InstanceMarketOptions.MarketType": "spot",
                    "InstanceMarketOptions.SpotOptions.SpotInstanceType": "one-time",
                    "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior": "terminate",
                }
            )
        for n, resource in enumerate(("instance", "volume"), start=1):
            params.update(_tag_spec(n, resource, tags))
        root = self._call(region, "RunInstances", params)
        instance_id = root.findtext("instancesSet/item/instanceId")
        if not instance_id:
            raise ProviderError(f"EC2 RunInstances in {zone} returned no instance id")
        _log.info("launched EC2 instance", extra=log.kv(id=instance_id, zone=zone, type=spec.offer.instance_type))
        return instance_id

    def _wait_running(self, region: str, ids: list[str]) -> None:
        deadline = time.monotonic() + self.launch_timeout
        while True:
            seen = {i.id: i for i in self._describe(region, {"instance-id": ids})}
            dead = [i for i in seen.values() if i.state.is_gone]
            if dead:
                reasons = "; ".join(f"{i.id}: {i.reason or i.state.value}" for i in dead)
                capacity = any("Capacity" in (i.reason or "") or i.state is InstanceState.PREEMPTED for i in dead)
                raise (CapacityError if capacity else ProviderError)(f"EC2 instances died while starting: {reasons}")
            if len(seen) == len(ids) and all(i.state is InstanceState.RUNNING for i in seen.values()):
                return
            if time.monotonic() > deadline:
                raise ProviderError(f"EC2 instances {', '.join(ids)} not running after {self.launch_timeout:.0f}s")
            time.sleep(self.poll_s)

    def _wait_gone(self, region: str, ids: list[str]) -> None:
        deadline = time.monotonic() + self.launch_timeout
        while any(not i.state.is_gone for i in self._describe(region, {"instance-id": ids})):
            if time.monotonic() > deadline:
                raise ProviderError(f"EC2 instances {', '.join(ids)} not terminated after {self.launch_timeout:.0f}s")
            time.sleep(self.poll_s)

    def _ensure_key_pair(self, region: str, cluster: str, public_key: str) -> str:
        """Import the cluster key once per region; the name carries a hash of the key material."""
        public_key = public_key.strip()
        name = f"spotrun-{cluster}-{hashlib.sha256(public_key.encode()).hexdigest()[:10]}"
        if self._call(region, "DescribeKeyPairs", _filters({"key-name": [name]})).find("keySet/item") is None:
            params = {
                "KeyName": name,
                "PublicKeyMaterial": base64.b64encode(public_key.encode()).decode(),
                **_tag_spec(1, "key-pair", {TAG_SPOTRUN: "1", TAG_CLUSTER: cluster}),
            }
            self._call(region, "ImportKeyPair", params, ignore={"InvalidKeyPair.Duplicate"})
        return name

    def _ensure_security_group(self, region: str, cluster: str) -> str:
        """The cluster's group: SSH from `ssh_cidr`, everything between members. Idempotent."""
        name = f"spotrun-{cluster}"
        query = _filters({"group-name": [name], f"tag:{TAG_CLUSTER}": [cluster]})
        group_id = self._call(region, "DescribeSecurityGroups", query).findtext("securityGroupInfo/item/groupId")
        if not group_id:
            params = {
                "GroupName": name,
                "GroupDescription": f"spotrun cluster {cluster}",
                **_tag_spec(1, "security-group", {TAG_SPOTRUN: "1", TAG_CLUSTER: cluster}),
            }
            root = self._call(region, "CreateSecurityGroup", params, ignore={"InvalidGroup.Duplicate"})
            group_id = root.findtext("groupId") or self._call(region, "DescribeSecurityGroups", query).findtext(
                "securityGroupInfo/item/groupId"
            )
            if not group_id:
                raise ProviderError(f"EC2 created security group {name} in {region} but reports no id for it")
        rules = {
            "IpPermissions.1.IpProtocol": "tcp",
            "IpPermissions.1.FromPort": "22",
            "IpPermissions.1.ToPort": "22",
            "IpPermissions.1.IpRanges.1.CidrIp": self.ssh_cidr,
            "IpPermissions.2.IpProtocol": "-1",
            "IpPermissions.2.Groups.1.GroupId": group_id,
        }
        self._call(
            region,
            "AuthorizeSecurityGroupIngress",
            {"GroupId": group_id, **rules},
            ignore={"InvalidPermission.Duplicate"},
        )
        return group_id

    def _delete_group(self, region: str, group_id: str) -> None:
        deadline = time.monotonic() + self.launch_timeout
        while True:
            try:
                self._call(region, "DeleteSecurityGroup", {"GroupId": group_id}, ignore={"InvalidGroup.NotFound"})
                return
            except ProviderError as exc:  # DependencyViolation: an instance still shuts down
                if "DependencyViolation" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(self.poll_s)

    def _image(self, region: str) -> str:
        if self.image:
            return self.image
        if region not in self._images:
            root = self._call(
                region,
                "DescribeImages",
                {
                    "Owner.1": "amazon",
                    **_filters({"name": [DEFAULT_IMAGE_NAME], "state": ["available"], "architecture": ["x86_64"]}),
                },
            )
            images = sorted(
                (
                    (i.findtext("creationDate") or "", i.findtext("imageId") or "")
                    for i in root.iterfind("imagesSet/item")
                ),
                reverse=True,
            )
            if not images:
                raise ProviderError(
                    f"no AWS Deep Learning GPU image found in {region}",
                    hint="set SPOTRUN_AWS_IMAGE to an AMI id (Ubuntu with cloud-init and NVIDIA drivers)",
                )
            self._images[region] = images[0][1]
        return self._images[region]

    # -- reading ------------------------------------------------------------------------------
    def _describe(self, region: str, filters: Mapping[str, Sequence[str]]) -> list[Instance]:
        params, found = _filters(filters), []
        while True:
            root = self._call(region, "DescribeInstances", params)
            for item in root.iterfind("reservationSet/item/instancesSet/item"):
                inst = self._instance(item, region)
                if inst is not None:
                    found.append(inst)
            token = root.findtext("nextToken")
            if not token:
                return found
            params = {**params, "NextToken": token}

    def _instance(self, item: Element, region: str) -> Instance | None:
        tags = {t.findtext("key") or "": t.findtext("value") or "" for t in item.iterfind("tagSet/item")}
        if TAG_CLUSTER not in tags:
            return None
        state, reason = parse_state(item)
        launched = item.findtext("launchTime")
        return Instance(
            id=item.findtext("instanceId") or "",
            cluster=tags[TAG_CLUSTER],
            provider=self.name,
            zone=item.findtext("placement/availabilityZone") or "",
            instance_type=item.findtext("instanceType") or "",
            state=state,
            reason=reason,
            host=item.findtext("ipAddress") or item.findtext("privateIpAddress") or "",
            ssh_port=22,
            ssh_user=self.ssh_user,
            host_public_key=tags.get(TAG_HOST_KEY, ""),
            metadata_url=METADATA_URL,
            price_per_hour=_float(tags.get(TAG_PRICE)),
            on_demand_per_hour=_float(tags.get(TAG_ON_DEMAND)),
            launched_at=datetime.fromisoformat(launched.replace("Z", "+00:00")).timestamp() if launched else 0.0,
            labels={
                **{k[len(LABEL_PREFIX) :]: v for k, v in tags.items() if k.startswith(LABEL_PREFIX)},
                "cluster": tags[TAG_CLUSTER],
                "idempotency_key": tags.get(TAG_KEY, ""),
            },
            extra={
                "region": region,
                "index": tags.get(TAG_INDEX),
                "private_ip": item.findtext("privateIpAddress"),
                "lifecycle": item.findtext("instanceLifecycle") or "on-demand",
                "ec2_state": item.findtext("instanceState/name"),
                "state_reason_code": item.findtext("stateReason/code"),
                "notice_protocol": self.notice_protocol,
            },
        )

    def _spot_prices(self, region: str) -> list[dict[str, Any]]:
        from spotrun.providers.price_cache import cached

        def fetch() -> list[dict[str, Any]]:
            params = {
                "StartTime": datetime.utcnow().strftime("%Y-%m-%dT%H:%M:%SZ"),
                **_numbered("InstanceType", sorted(self.catalog)),
            }
            latest: dict[tuple[str, str], tuple[str, float]] = {}
            while True:
                root = self._call(region, "DescribeSpotPriceHistory", params)
                latest.update(parse_spot_prices(root, latest))
                token = root.findtext("nextToken")
                if not token:
                    break
                params = {**params, "NextToken": token}
            return [
                {"zone": z, "instance_type": t, "price": p, "timestamp": ts}
                for (z, t), (ts, p) in sorted(latest.items())
            ]

        endpoint = hashlib.sha256((self.endpoint_url or "aws").encode()).hexdigest()[:8]
        rows, fetched_at = cached(f"aws-spot-{region}-{endpoint}", self.price_ttl_s, fetch)
        self._fetched_at[region] = fetched_at
        return rows

    # -- plumbing -----------------------------------------------------------------------------
    def _driver(self, region: str) -> Any:
        """This thread's driver for `region` (libcloud connections are not thread-safe)."""
        drivers = self._local.__dict__.setdefault("drivers", {})
        if region not in drivers:
            from spotrun.providers.aws.driver import SpotrunEC2Driver

            key, secret, token = keys()
            try:
                drivers[region] = SpotrunEC2Driver(
                    key, secret, region=region, token=token, endpoint_url=self.endpoint_url
                )
            except ValueError as exc:
                raise ProviderError(
                    f"AWS region {region!r} is not known: {exc}", hint="use a region name such as us-east-1"
                ) from exc
        return drivers[region]

    def _call(
        self, region: str, action: str, params: Mapping[str, str], *, ignore: frozenset[str] | set[str] = frozenset()
    ) -> Element:
        """One EC2 call; EC2 errors become CapacityError / ProviderError, codes in `ignore` an
        empty element."""
        from spotrun.providers.aws.driver import Ec2ApiError

        driver = self._driver(region)
        try:
            return driver.query(action, dict(params))
        except Ec2ApiError as exc:
            if exc.code in ignore:
                return Element("ignored")
            if exc.code in CAPACITY_CODES:
                raise CapacityError(f"EC2 {action} in {region}: {exc}") from exc
            if exc.code in CREDENTIAL_CODES:
                raise ProviderError(
                    f"AWS rejected the credentials ({exc})",
                    hint="check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or ~/.aws/credentials",
                ) from exc
            raise ProviderError(f"EC2 {action} in {region} failed: {exc}") from exc
        except Exception as exc:  # libcloud's transport errors share no base class
            where = self.endpoint_url or f"EC2 in {region}"
            raise ProviderError(f"EC2 {action} failed: cannot talk to {where}: {type(exc).__name__}: {exc}") from exc

    def _state_file(self) -> Path:
        return spotrun_home() / "aws" / "regions.json"

    def _read_regions(self) -> dict[str, list[str]]:
        try:
            return json.loads(self._state_file().read_text())
        except (OSError, ValueError):
            return {}

    def _write_regions(self, data: dict[str, list[str]]) -> None:
        path = self._state_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)

    def _remember_region(self, cluster: str, region: str) -> None:
        """Written before anything is created there, so `instances`/`cleanup` look in it later."""
        data = self._read_regions()
        if region not in data.get(cluster, []):
            data.setdefault(cluster, []).append(region)
            self._write_regions(data)

    def _forget_cluster(self, cluster: str) -> None:
        data = self._read_regions()
        if data.pop(cluster, None) is not None:
            self._write_regions(data)

    def _regions_of(self, cluster: str) -> list[str]:
        return list(dict.fromkeys([*self.regions, *self._read_regions().get(cluster, [])]))

    def _all_known_regions(self) -> list[str]:
        return list(dict.fromkeys([*self.regions, *(r for rs in self._read_regions().values() for r in rs)]))


def parse_state(item: Element) -> tuple[InstanceState, str | None]:
    """Normalised state and reason of a DescribeInstances item; a spot interruption
    (`Server.SpotInstanceTermination`) is PREEMPTED with EC2's message as the reason."""
    name = item.findtext("instanceState/name") or ""
    code = item.findtext("stateReason/code") or ""
    message = item.findtext("stateReason/message") or code or None
    if name in _STATES:
        return _STATES[name], None
    if code in SPOT_REASONS:
        return InstanceState.PREEMPTED, message
    if code in FAILED_REASONS:
        return InstanceState.FAILED, message
    return InstanceState.TERMINATED, message or name or None


def parse_spot_prices(
    root: Element, known: Mapping[tuple[str, str], tuple[str, float]] | None = None
) -> dict[tuple[str, str], tuple[str, float]]:
    """{(zone, type): (timestamp, $/h)} keeping the newest Linux/UNIX price per zone and type."""
    latest = dict(known or {})
    for item in root.iterfind("spotPriceHistorySet/item"):
        if not (item.findtext("productDescription") or "").startswith("Linux/UNIX"):
            continue
        key = (item.findtext("availabilityZone") or "", item.findtext("instanceType") or "")
        stamp, price = item.findtext("timestamp") or "", _float(item.findtext("spotPrice"))
        if key not in latest or stamp > latest[key][0]:
            latest[key] = (stamp, price)
    return latest


def _float(text: str | None) -> float:
    try:
        return float(text) if text else 0.0
    except ValueError:
        return 0.0


def _numbered(name: str, values: Sequence[str]) -> dict[str, str]:
    return {f"{name}.{i}": v for i, v in enumerate(values, start=1)}


def _filters(filters: Mapping[str, Sequence[str]]) -> dict[str, str]:
    params = {}
    for i, (name, values) in enumerate(filters.items(), start=1):
        params[f"Filter.{i}.Name"] = name
        params.update({f"Filter.{i}.Value.{j}": v for j, v in enumerate(values, start=1)})
    return params


def _tag_spec(n: int, resource: str, tags: Mapping[str, str]) -> dict[str, str]:
    params = {f"TagSpecification.{n}.ResourceType": resource}
    for i, (key, value) in enumerate(tags.items(), start=1):
        params[f"TagSpecification.{n}.Tag.{i}.Key"] = key
        params[f"TagSpecification.{n}.Tag.{i}.Value"] = value
    return params

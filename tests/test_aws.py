"""The AWS provider against a real EC2 API server: moto in server mode on loopback.

The server runs in this process (ThreadedMotoServer), so a test can reach into moto's backend to
do what AWS does and moto does not: interrupt a spot instance, run out of capacity. The provider
only ever talks HTTP to it, through libcloud, exactly as it would to AWS.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("moto.server")
pytest.importorskip("libcloud")

from spotrun.providers import InstanceState, LaunchSpec, get_provider, supports
from spotrun.providers.aws.driver import SpotrunEC2Driver
from spotrun.providers.aws.provider import AwsProvider

from spotrun.errors import CapacityError, ProviderError

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-east-1"
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx0eHhYV3Nm1v0dYh3sCq0nB0u2mM8gqf0XoYlL3b1F test@spotrun"


@pytest.fixture(autouse=True)
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials and a private $SPOTRUN_HOME (price cache, region bookkeeping)."""
    for name in (
        "AWS_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "SPOTRUN_AWS_REGIONS",
        "SPOTRUN_AWS_ENDPOINT_URL",
        "SPOTRUN_AWS_IMAGE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("SPOTRUN_HOME", str(tmp_path / "home"))


@pytest.fixture
def ec2():
    """moto's EC2 backend for the test region (the server reads the same objects)."""
    from moto.ec2.models import ec2_backends

    return ec2_backends[ACCOUNT][REGION]


@pytest.fixture
def image(ec2) -> str:
    return next(iter(ec2.amis))


@pytest.fixture
def provider(moto_url: str, image: str) -> AwsProvider:
    return AwsProvider(region=REGION, endpoint_url=moto_url, image=image, poll_s=0.05, launch_timeout=20)


@pytest.fixture
def name() -> str:
    return f"c-{uuid.uuid4().hex[:8]}"


def _offer(provider: AwsProvider, instance_type: str = "p4d.24xlarge", zone: str = "us-east-1a"):
    return next(o for o in provider.offers() if o.instance_type == instance_type and o.zone == zone and o.spot)


def _spec(provider: AwsProvider, cluster: str, count: int, key: str = "k1", **kw) -> LaunchSpec:
    return LaunchSpec(
        cluster=cluster,
        offer=_offer(provider, **kw),
        count=count,
        ssh_public_key=PUBLIC_KEY,
        idempotency_key=key,
        labels={"role": "worker"},
    )


def test_registered_and_cheap_to_build() -> None:
    provider = get_provider("aws", region="us-west-2")
    assert provider.name == "aws" and provider.notice_protocol == "aws" and provider.regions == ["us-west-2"]
    assert supports(provider, "cleanup") and not supports(provider, "preempt")


def test_missing_credentials_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, moto_url: str) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    with pytest.raises(ProviderError, match="no AWS credentials found") as info:
        AwsProvider(region=REGION, endpoint_url=moto_url).offers()
    assert "AWS_ACCESS_KEY_ID" in str(info.value) and "\n" not in str(info.value)


def test_credentials_file_profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from spotrun.providers.aws.credentials import keys

    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    path = tmp_path / "credentials"
    path.write_text(
        "[default]\naws_access_key_id = A\naws_secret_access_key = B\n"
        "[work]\naws_access_key_id = C\naws_secret_access_key = D\naws_session_token = T\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    assert keys() == ("A", "B", None)
    monkeypatch.setenv("AWS_PROFILE", "work")
    assert keys() == ("C", "D", "T")


def test_offers_have_live_spot_prices_and_age(provider: AwsProvider) -> None:
    offers = provider.offers()
    p4d = [o for o in offers if o.instance_type == "p4d.24xlarge" and o.spot]
    assert {o.zone for o in p4d} >= {"us-east-1a", "us-east-1b"}
    offer = p4d[0]
    assert offer.gpus == 8 and offer.gpu_name == "A100" and offer.cpus == 96
    assert offer.spot_price > 0 and offer.on_demand_price > 30  # libcloud's on-demand table
    assert any(o.instance_type == "p4d.24xlarge" and not o.spot for o in offers)
    age = provider.price_age(offer)
    assert age is not None and 0 <= age < 60
    cache = list((Path(provider_home()) / "cache" / "prices").glob("aws-spot-us-east-1-*.json"))
    assert cache and json.loads(cache[0].read_text())["value"]


def provider_home() -> str:
    import os

    return os.environ["SPOTRUN_HOME"]


def test_spot_price_parsing_keeps_newest_linux_price() -> None:
    import xml.etree.ElementTree as ET

    from spotrun.providers.aws.provider import parse_spot_prices

    body = """<DescribeSpotPriceHistoryResponse><spotPriceHistorySet>
      <item><availabilityZone>us-east-1a</availabilityZone><instanceType>g5.xlarge</instanceType>
        <productDescription>Linux/UNIX</productDescription><spotPrice>0.4100</spotPrice>
        <timestamp>2024-05-01T10:00:00.000Z</timestamp></item>
      <item><availabilityZone>us-east-1a</availabilityZone><instanceType>g5.xlarge</instanceType>
        <productDescription>Linux/UNIX</productDescription><spotPrice>0.3900</spotPrice>
        <timestamp>2024-05-01T12:00:00.000Z</timestamp></item>
      <item><availabilityZone>us-east-1a</availabilityZone><instanceType>g5.xlarge</instanceType>
        <productDescription>Windows</productDescription><spotPrice>0.9</spotPrice>
        <timestamp>2024-05-01T13:00:00.000Z</timestamp></item>
    </spotPriceHistorySet></DescribeSpotPriceHistoryResponse>"""
    assert parse_spot_prices(ET.fromstring(body)) == {("us-east-1a", "g5.xlarge"): ("2024-05-01T12:00:00.000Z", 0.39)}


def test_launch_tags_keypair_group_userdata_and_idempotency(provider: AwsProvider, ec2, name: str) -> None:
    started = time.monotonic()
    ids = provider.launch(_spec(provider, name, 4))
    launch_s = time.monotonic() - started
    assert len(ids) == 4 and launch_s < 15

    # Same key again: nothing new. A larger count launches only the difference.
    assert provider.launch(_spec(provider, name, 4)) == ids
    more = provider.launch(_spec(provider, name, 5))
    assert more[:4] == ids and len(more) == 5

    insts = provider.instances(name)
    assert sorted(i.id for i in insts) == sorted(more)
    host_keys = set()
    driver = SpotrunEC2Driver("testing", "testing", region=REGION, endpoint_url=provider.endpoint_url)
    for inst in insts:
        assert inst.state is InstanceState.RUNNING and inst.zone == "us-east-1a"
        assert inst.instance_type == "p4d.24xlarge" and inst.host and inst.ssh_port == 22
        assert inst.labels == {"role": "worker", "cluster": name, "idempotency_key": "k1"}
        assert inst.host_public_key.startswith("ssh-ed25519 ") and inst.price_per_hour > 0
        assert inst.metadata_url == "http://169.254.169.254" and inst.extra["lifecycle"] == "spot"
        host_keys.add(inst.host_public_key)
        tags = ec2.describe_tags(filters={"resource-id": [inst.id]})
        tag_map = {t["key"]: t["value"] for t in tags}
        assert tag_map["spotrun"] == "1" and tag_map["spotrun-cluster"] == name
        assert tag_map["spotrun:idempotency-key"] == "k1"
        attr = driver.query("DescribeInstanceAttribute", {"InstanceId": inst.id, "Attribute": "userData"})
        user_data = base64.b64decode(attr.findtext("userData/value") or "").decode()
        assert user_data.startswith("#cloud-config\n")
        config = json.loads(user_data.split("\n", 1)[1])
        assert config["ssh_keys"]["ed25519_public"] == inst.host_public_key
        assert "BEGIN OPENSSH PRIVATE KEY" in config["ssh_keys"]["ed25519_private"]
        assert config["users"][1]["ssh_authorized_keys"] == [PUBLIC_KEY]
    assert len(host_keys) == 5, "every VM has its own host key"

    # Key pair and security group, tagged with the cluster; SSH open, the rest only within the group.
    assert [k.findtext("keyName") for k in _key_pairs(driver, name)] == [ec2.get_instance(ids[0]).key_name]
    groups = _groups(driver, name)
    assert len(groups) == 1 and groups[0].findtext("groupName") == f"spotrun-{name}"
    group_id = groups[0].findtext("groupId")
    rules = {(r.findtext("ipProtocol"), r.findtext("fromPort")): r for r in groups[0].iterfind("ipPermissions/item")}
    assert [r.findtext("cidrIp") for r in rules[("tcp", "22")].iterfind("ipRanges/item")] == ["0.0.0.0/0"]
    assert [g.findtext("groupId") for g in rules[("-1", None)].iterfind("groups/item")] == [group_id]
    assert not rules[("-1", None)].findall("ipRanges/item"), "cluster traffic is not open to the world"
    assert group_id in [g.id for g in ec2.get_instance(ids[0]).security_groups]
    print(f"\nlaunch of 4 spot instances against moto: {launch_s:.2f}s")


def _key_pairs(driver: SpotrunEC2Driver, cluster: str) -> list:
    root = driver.query("DescribeKeyPairs", {"Filter.1.Name": "tag:spotrun-cluster", "Filter.1.Value.1": cluster})
    return root.findall("keySet/item")


def _groups(driver: SpotrunEC2Driver, cluster: str) -> list:
    root = driver.query("DescribeSecurityGroups", {"Filter.1.Name": "tag:spotrun-cluster", "Filter.1.Value.1": cluster})
    return root.findall("securityGroupInfo/item")


def test_spot_interruption_is_preempted(provider: AwsProvider, ec2, name: str) -> None:
    from moto.ec2.models.instances import StateReason

    ids = provider.launch(_spec(provider, name, 2, zone="us-east-1b"))
    victim = ec2.get_instance(ids[0])
    victim._state.name, victim._state.code = "terminated", 48  # what EC2 does after the 2-minute notice
    victim.state_reason = StateReason(
        "Server.SpotInstanceTermination: Spot instance termination", "Server.SpotInstanceTermination"
    )
    states = {i.id: i for i in provider.instances(name)}
    assert states[ids[0]].state is InstanceState.PREEMPTED and states[ids[0]].state.is_gone
    assert states[ids[0]].reason == "Server.SpotInstanceTermination: Spot instance termination"
    assert states[ids[1]].state is InstanceState.RUNNING


def test_terminate_and_cleanup_leave_nothing(provider: AwsProvider, ec2, name: str) -> None:
    ids = provider.launch(_spec(provider, name, 3))
    provider.terminate(ids[:1])
    provider.terminate([*ids[:1], "i-0123456789abcdef0"])  # idempotent, unknown ignored
    states = {i.id: i.state for i in provider.instances(name)}
    assert states[ids[0]] is InstanceState.TERMINATED and states[ids[1]] is InstanceState.RUNNING

    provider.cleanup(name)
    provider.cleanup(name)  # idempotent
    assert all(i.state.is_gone for i in provider.instances(name))
    driver = SpotrunEC2Driver("testing", "testing", region=REGION, endpoint_url=provider.endpoint_url)
    assert _key_pairs(driver, name) == [] and _groups(driver, name) == []


def test_capacity_error_maps_to_capacity_error(
    provider: AwsProvider, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models import EC2Backend

    def no_capacity(self, *args, **kwargs):
        raise EC2ClientError(
            "InsufficientInstanceCapacity",
            "We currently do not have sufficient p4d.24xlarge capacity in the Availability Zone "
            "you requested (us-east-1a).",
        )

    spec = _spec(provider, name, 2)
    monkeypatch.setattr(EC2Backend, "run_instances", no_capacity)
    with pytest.raises(CapacityError, match=r"InsufficientInstanceCapacity.*sufficient p4d\.24xlarge capacity"):
        provider.launch(spec)


def test_other_errors_keep_their_code(provider: AwsProvider, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.models import EC2Backend

    def bad_request(self, *args, **kwargs):
        raise EC2ClientError("InvalidParameterValue", "Value (p4d.24xlarge) for parameter instanceType is invalid.")

    spec = _spec(provider, name, 1)
    monkeypatch.setattr(EC2Backend, "run_instances", bad_request)
    with pytest.raises(ProviderError, match="RunInstances in us-east-1 failed: InvalidParameterValue") as info:
        provider.launch(spec)
    assert not isinstance(info.value, CapacityError)


def test_default_image_lookup_names_the_variable(provider: AwsProvider, name: str) -> None:
    no_image = AwsProvider(region=REGION, endpoint_url=provider.endpoint_url, poll_s=0.05)
    with pytest.raises(ProviderError, match="SPOTRUN_AWS_IMAGE"):
        no_image.launch(_spec(provider, name, 1))


def test_unreachable_endpoint_is_provider_error() -> None:
    provider = AwsProvider(region=REGION, endpoint_url="http://127.0.0.1:9")
    with pytest.raises(ProviderError, match=re.escape("cannot talk to http://127.0.0.1:9")):
        provider.offers()

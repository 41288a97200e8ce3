"""The emulated metadata endpoint speaks the clouds' notice protocols, and NoticeWatcher reads them.

Real HTTP on loopback against a MetadataServer in this process; the notice is armed through the
VM dir exactly as LocalProvider.preempt does it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from spotrun.providers.local.metadata import MetadataServer, arm_notice, gcp_etag, read_notice

from spotrun.node.notices import NoticeWatcher, PreemptionNotice

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@pytest.fixture()
def endpoint(tmp_path: Path) -> Iterator[tuple[MetadataServer, Path]]:
    server = MetadataServer(tmp_path, {"id": "vm-1", "name": "vm-1", "zone": "local-a", "instance_type": "local-cpu-2"})
    server.start()
    try:
        yield server, tmp_path
    finally:
        server.close()


def _call(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, data: bytes | None = None
) -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with _OPENER.open(req, timeout=10) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers.items())
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(), dict(exc.headers.items())


def test_aws_imdsv2(endpoint: tuple[MetadataServer, Path]) -> None:
    server, vm_dir = endpoint
    action = server.url + "/latest/meta-data/spot/instance-action"
    assert _call(action)[0] == 401
    assert _call(server.url + "/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "0"})[0] == 400
    status, token, headers = _call(
        server.url + "/latest/api/token", "PUT", {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    )
    assert status == 200 and token and headers["X-aws-ec2-metadata-token-ttl-seconds"] == "60"
    auth = {"X-aws-ec2-metadata-token": token}
    assert _call(action, headers={"X-aws-ec2-metadata-token": "forged"})[0] == 401
    assert _call(server.url + "/latest/meta-data/instance-id", headers=auth)[1] == "vm-1"
    assert _call(action, headers=auth)[0] == 404
    assert NoticeWatcher("aws", server.url).poll() is None

    notice = arm_notice(vm_dir, 120)
    status, body, _ = _call(action, headers=auth)
    assert status == 200
    assert json.loads(body) == {
        "action": "terminate",
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(notice.deadline))),
    }
    got = NoticeWatcher("aws", server.url).poll()
    assert got is not None and got.source == "aws" and int(notice.deadline) == got.deadline


def test_aws_watcher_refreshes_a_rejected_token(tmp_path: Path) -> None:
    first = MetadataServer(tmp_path, {"id": "vm-1"})
    first.start()
    port = first.port
    watcher = NoticeWatcher("aws", first.url)
    assert watcher.poll() is None and watcher.reader.token is not None
    first.close()
    second = MetadataServer(tmp_path, {"id": "vm-1"}, port=port)  # a restarted endpoint forgets tokens
    second.start()
    try:
        arm_notice(tmp_path, 60)
        assert watcher.poll() is None  # 401: dropped quietly, token discarded
        assert isinstance(watcher.poll(), PreemptionNotice)
    finally:
        second.close()


def test_gcp_preempted_and_long_poll(endpoint: tuple[MetadataServer, Path]) -> None:
    server, vm_dir = endpoint
    url = server.url + "/computeMetadata/v1/instance/preempted"
    google = {"Metadata-Flavor": "Google"}
    assert _call(url)[0] == 403
    status, body, headers = _call(url, headers=google)
    assert (status, body, headers["ETag"]) == (200, "FALSE", gcp_etag("FALSE"))

    started = time.monotonic()
    assert _call(url + "?wait_for_change=true&timeout_sec=1", headers=google)[1] == "FALSE"
    assert 0.9 < time.monotonic() - started < 3
    # A stale last_etag answers at once.
    started = time.monotonic()
    assert _call(url + "?wait_for_change=true&last_etag=0000&timeout_sec=30", headers=google)[1] == "FALSE"
    assert time.monotonic() - started < 1

    threading.Timer(0.4, arm_notice, (vm_dir, 30)).start()
    started = time.monotonic()
    status, body, headers = _call(
        url + f"?wait_for_change=true&last_etag={gcp_etag('FALSE')}&timeout_sec=30", headers=google
    )
    assert (status, body, headers["ETag"]) == (200, "TRUE", gcp_etag("TRUE"))
    assert 0.3 < time.monotonic() - started < 2


def test_gcp_watcher_wait_wakes_on_notice_and_on_stop(endpoint: tuple[MetadataServer, Path]) -> None:
    server, vm_dir = endpoint
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert NoticeWatcher("gcp", server.url, long_poll_s=1).wait(stop) is None
    assert time.monotonic() - started < 2.5

    threading.Timer(1.5, arm_notice, (vm_dir, 30)).start()
    started = time.monotonic()
    got = NoticeWatcher("gcp", server.url, long_poll_s=5, lead_s=30).wait(threading.Event())
    assert got is not None and got.source == "gcp" and got.raw == "TRUE"
    assert 1.4 < time.monotonic() - started < 2.5  # woken by the long poll, not by a later poll
    assert got.deadline == pytest.approx(got.received_at + 30)


def test_azure_scheduled_events(endpoint: tuple[MetadataServer, Path]) -> None:
    server, vm_dir = endpoint
    url = server.url + "/metadata/scheduledevents?api-version=2020-07-01"
    assert _call(url)[0] == 400
    assert _call(server.url + "/metadata/scheduledevents", headers={"Metadata": "true"})[0] == 400
    status, body, _ = _call(url, headers={"Metadata": "true"})
    assert status == 200 and json.loads(body)["Events"] == []
    assert NoticeWatcher("azure", server.url).poll() is None

    notice = arm_notice(vm_dir, 45)
    doc = json.loads(_call(url, headers={"Metadata": "true"})[1])
    (event,) = doc["Events"]
    assert (event["EventType"], event["ResourceType"], event["Resources"], event["EventStatus"]) == (
        "Preempt",
        "VirtualMachine",
        ["vm-1"],
        "Scheduled",
    )
    assert event["EventId"] == notice.event_id and event["NotBefore"].endswith(" GMT")
    got = NoticeWatcher("azure", server.url).poll()
    assert got is not None and got.deadline == int(notice.deadline)

    ack = json.dumps({"StartRequests": [{"EventId": event["EventId"]}]}).encode()
    assert _call(url, "POST", {"Metadata": "true"}, ack)[0] == 200
    assert _call(url, "POST", {"Metadata": "true"}, b'{"StartRequests": [{"EventId": "nope"}]}')[0] == 400
    after = json.loads(_call(url, headers={"Metadata": "true"})[1])
    assert after["Events"][0]["EventStatus"] == "Started" and after["DocumentIncarnation"] > doc["DocumentIncarnation"]


def test_azure_watcher_ignores_other_vms_events(tmp_path: Path) -> None:
    server = MetadataServer(tmp_path, {"id": "vm-1", "name": "vm-1"})
    server.start()
    try:
        watcher = NoticeWatcher("azure", server.url)
        watcher.reader.vm_name = "some-other-vm"  # as if the compute name said so
        arm_notice(tmp_path, 30)
        assert watcher.poll() is None
    finally:
        server.close()


def test_unreachable_endpoint_never_raises() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"  # bound, not listening: refused
    for protocol in ("aws", "gcp", "azure"):
        watcher = NoticeWatcher(protocol, dead, timeout=0.5)
        assert watcher.poll() is None
        stop = threading.Event()
        threading.Timer(0.2, stop.set).start()
        assert watcher.wait(stop) is None
    with pytest.raises(ValueError, match="'ibm'"):
        NoticeWatcher("ibm")


def test_arm_notice_keeps_the_earlier_deadline(tmp_path: Path) -> None:
    first = arm_notice(tmp_path, 10, now=1000.0)
    assert arm_notice(tmp_path, 60, now=1001.0) == first
    sooner = arm_notice(tmp_path, 2, now=1002.0)
    assert sooner.deadline == 1004.0 and read_notice(tmp_path) == sooner
